"""Store(sharing="shared", negative_ttl=...): several stores on one worker directory (what
the SGLang backend opens for the ranks of an MLA model)."""

from __future__ import annotations

import pytest

import tierkv_g3


def test_a_shared_store_sees_blocks_another_store_wrote(tmp_path):
    k = tierkv_g3.chain_hashes(list(range(32)), 16)
    with tierkv_g3.Store(tmp_path, "w", sharing="shared", negative_ttl=0.0) as writer, tierkv_g3.Store(
        tmp_path, "w", sharing="shared", negative_ttl=0.0
    ) as reader:
        assert reader.contains_prefix(k) == 0
        writer.put_many(k, [b"a" * 100, b"b" * 100])
        assert reader.contains_prefix(k) == 2
        out = [bytearray(100), bytearray(100)]
        assert reader.get_many_into(k, out) == [100, 100] and out[1] == b"b" * 100


def test_an_exclusive_worker_refuses_a_second_store_and_bad_options(tmp_path):
    with tierkv_g3.Store(tmp_path, "w"):
        with pytest.raises(tierkv_g3.WorkerBusyError):
            tierkv_g3.Store(tmp_path, "w")
    with pytest.raises(tierkv_g3.ConfigError):
        tierkv_g3.Store(tmp_path, "x", sharing="both")
    with pytest.raises(ValueError, match="negative_ttl"):
        tierkv_g3.Store(tmp_path, "y", sharing="shared", negative_ttl=-1.0)
