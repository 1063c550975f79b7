"""A model test (hypothesis): random batches of puts, gets, removes and reopens against a
dict. Each put is its own chain (a one-block batch), so a remove takes only its key."""

from __future__ import annotations

import shutil
import tempfile

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import tierkv_g3

KEYS = tierkv_g3.chain_hashes(list(range(16 * 12)), 1)[:12]
key = st.sampled_from(KEYS)


class StoreModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.root = tempfile.mkdtemp()
        self.store = tierkv_g3.Store(self.root, "rank0", stats_interval=None)
        self.model: dict[str, bytes] = {}

    def teardown(self):
        self.store.close()
        shutil.rmtree(self.root)

    @rule(k=key, data=st.binary(max_size=9000))
    def put(self, k, data):
        self.store.put_many([k], [data])
        self.model[k] = data

    @rule(ks=st.lists(key, max_size=6), extra=st.integers(0, 64), as_numpy=st.booleans())
    def get(self, ks, extra, as_numpy):
        size = max([len(self.model.get(k, b"")) for k in ks], default=0) + extra
        bufs = [np.zeros(size, np.uint8) if as_numpy else bytearray(size) for _ in ks]
        got = self.store.get_many_into(ks, bufs)
        for k, n, b in zip(ks, got, bufs):
            want = self.model.get(k)
            assert n == (None if want is None else len(want))
            if want is not None:
                assert bytes(memoryview(b)[:n]) == want

    @rule(ks=st.lists(key, max_size=4, unique=True))
    def remove(self, ks):
        assert self.store.remove_many(ks) == [k in self.model for k in ks]
        for k in ks:
            self.model.pop(k, None)

    @precondition(lambda self: len(self.model) > 0)
    @rule()
    def reopen(self):
        self.store.close()
        self.store = tierkv_g3.Store(self.root, "rank0", stats_interval=None)
        assert self.store.stats()["blocks_at_open"] == len(self.model)

    @invariant()
    def contains_agrees(self):
        assert self.store.contains_many(KEYS) == [k in self.model for k in KEYS]


StoreModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_store_against_a_dict = StoreModel.TestCase
