"""The Store options an engine's config may carry (`_engines.STORE_OPTIONS`, which every backend
accepts and refuses the rest of) are exactly the keyword arguments of `tierkv_g3.Store`: a
keyword added to the Store reaches the engines' configs, or this test says which is missing."""

from __future__ import annotations

import inspect

import tierkv_g3
from tierkv_g3._engines import STORE_OPTIONS


def test_the_engines_option_list_is_the_stores_keywords():
    params = inspect.signature(tierkv_g3.Store).parameters
    keywords = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert {"root", "worker"} <= set(params) and keywords
    assert set(STORE_OPTIONS) == keywords, (
        f"missing from STORE_OPTIONS: {sorted(keywords - set(STORE_OPTIONS))}; "
        f"not Store keywords: {sorted(set(STORE_OPTIONS) - keywords)}"
    )
    assert len(STORE_OPTIONS) == len(set(STORE_OPTIONS))


def test_a_store_left_to_its_defaults_has_the_rust_defaults(tmp_path):
    """The defaults are decided once, in Rust: every keyword of Store defaults to None
    (`StoreConfig::default()`'s value) except the two whose None means "off"
    (`direct_puts_from`, `stats_interval`), which take the Rust default's value; a Store left
    to them has StoreConfig::default()'s engine (psync) and policy (adaptive). Before, the
    signature wrote its own, and its engine ("auto") was not Rust's."""
    params = inspect.signature(tierkv_g3.Store).parameters
    written = {
        n: p.default for n, p in params.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not None
    }
    assert set(written) <= {"direct_puts_from", "stats_interval"}, written
    with tierkv_g3.Store(tmp_path, "w") as s:
        assert (s.engine, s.policy, s.read_only) == ("psync", "adaptive", False)
