"""Unit tests of tools/benchstats.py: python3 -m pytest -q tools/test_benchstats.py"""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchstats as st  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def fio_report(bw, p50, p99, p999, rw="read", error=0):
    pct = {"50.000000": p50, "99.000000": p99, "99.900000": p999, "99.990000": 1}
    job = {"jobname": "j", "error": error, rw: {"bw_bytes": bw, "clat_ns": {"percentile": pct}}}
    return json.dumps({"fio version": "fio-3.33", "jobs": [job]})


def bench_report(**over):
    pct = {"50.000000": 10, "99.000000": 20, "99.900000": 30}
    doc = {"bw_bytes_per_sec": 2048.0, "ops_per_sec": 12.5, "errors": 0, "misses": 0,
           "verify_errors": 0, "evictions": 7, "read_misses": 0, "hit_ratio": 0.123456,
           "read": {"clat_ns": {"percentile": pct}, "first_error": None},
           "write": {"clat_ns": {"percentile": {k: v * 2 for k, v in pct.items()}},
                     "first_error": None},
           "store": {"misses": 0, "corrupt": 0}}
    doc.update(over)
    return doc


def cli(*args, stdin=""):
    done = subprocess.run([sys.executable, os.path.join(HERE, "benchstats.py"), *args],
                          input=stdin, capture_output=True, text=True)
    return done.returncode, done.stdout.strip(), done.stderr


def test_size_bytes():
    assert st.size_bytes("4k") == 4096
    assert st.size_bytes("2m") == 2 << 20
    assert st.size_bytes("1g") == 1 << 30
    assert st.size_bytes("2MiB") == 2 << 20
    assert st.size_bytes("32M") == 32 << 20
    assert st.size_bytes("4096") == 4096
    with pytest.raises(st.BenchError):
        st.size_bytes("2x")
    with pytest.raises(st.BenchError):
        st.size_bytes("")


def test_fio_figures_skip_text_before_the_report():
    text = "fio: note: both iodepth >= 1 and synchronous I/O engine\n{weird\n"
    text += fio_report(1000, 50, 990, 999)
    assert st.fio_figures(text, "read") == [1000.0, 50.0, 990.0, 999.0]


def test_fio_figures_direction_and_errors():
    assert st.fio_figures(fio_report(5, 1, 2, 3, rw="write"), "write")[0] == 5.0
    with pytest.raises(KeyError):
        st.fio_figures(fio_report(5, 1, 2, 3, rw="write"), "read")
    with pytest.raises(st.BenchError, match="error 5"):
        st.fio_figures(fio_report(5, 1, 2, 3, error=5), "read")
    with pytest.raises(st.BenchError):
        st.fio_figures("fio: no such file\n", "read")


def test_bench_figures_and_extra():
    doc = bench_report(store={"misses": 0, "corrupt": 0})
    assert st.bench_figures(doc, "read") == [2048.0, 10.0, 20.0, 30.0]
    assert st.bench_figures(doc, "write") == [2048.0, 20.0, 40.0, 60.0]
    assert st.bench_figures(doc, "write", ["evictions", "store.reused_files=0"])[4:] == [7.0, 0.0]
    with pytest.raises(st.BenchError):
        st.bench_figures(doc, "write", ["store.reused_files"])


def test_check_zero_fails_each_path():
    st.check_zero(bench_report(), ["errors", "misses", "verify_errors", "store.corrupt"])
    for bad in ({"errors": 1}, {"misses": 2}, {"verify_errors": 3},
                {"store": {"misses": 0, "corrupt": 1}}):
        with pytest.raises(st.BenchError, match="failed its checks"):
            st.check_zero(bench_report(**bad),
                          ["errors", "misses", "verify_errors", "store.corrupt"])
    doc = bench_report(errors=1, read={"first_error": "EIO", "clat_ns": {}})
    with pytest.raises(st.BenchError, match="first error: EIO"):
        st.check_zero(doc, ["errors"])


def test_median_ratio_is_the_median_of_per_round_ratios():
    # Per round: column 1 over column 0 is 2.0, 0.5, 1.5: median 1.5, not 7/5.
    rows = [[[10.0], [20.0]], [[100.0], [50.0]], [[2.0], [3.0]]]
    assert st.median_ratio(rows, 1, 0) == (1.5, 0.5, 2.0)
    assert st.ratios([[4.0, 2.0], [9.0, 3.0]], 1, 0) == [0.5, 1 / 3]
    assert st.ratio_cell((1.5, 0.5, 2.0)) == "1.50x (0.50-2.00x)"
    assert st.ratio_cell((1.5, 1.5, 1.5)) == "1.50x"
    assert st.ratio_cell((1.5, 0.5, 2.0), spread=False) == "1.50x"


def test_column_medians():
    rows = [[[1.0, 10.0]], [[3.0, 30.0]], [[2.0, 50.0]]]
    assert st.column_medians(rows, 0) == [2.0, 30.0]
    assert st.median([4, 1, 3, 2]) == 2.5


def test_median_row():
    assert st.median_row("A", "B", [1, 2, 3], [4, 5, 6]) == "| A | B | 2 | 5 | 0.40x |"
    assert st.median_row("a", "b", [1000, 3000], [1000]) == "| a | b | 2,000 | 1,000 | 2.00x |"


def test_rounds_table():
    rows = [[[2 * st.MIB, 1e6, 2e6, 3e6], [st.MIB, 1e6, 2e6, 3e6]],
            [[2 * st.MIB, 3e6, 4e6, 5e6], [4 * st.MIB, 1e6, 2e6, 3e6]]]
    lines = st.rounds_table([("bs", "2m"), ("io", "buffered")], "writer", ["fio", "tierkv"],
                            rows, lat_digits=2, ratio_cols=[("ratio to fio", 0)])
    assert lines[0] == "| bs | io | writer | MiB/s | ratio to fio | p50 ms | p99 ms | p99.9 ms |"
    assert lines[1] == "|---:|---|---|---:|---:|---:|---:|---:|"
    assert lines[2] == "| 2m | buffered | fio | 2 | 1.00x | 2.00 | 3.00 | 4.00 |"
    assert lines[3] == "| 2m | buffered | tierkv | 2 | 1.25x (0.50-2.00x) | 1.00 | 2.00 | 3.00 |"
    per = st.rounds_lines("2m", ["fio", "tierkv"], rows, label="r", pairs=[("t/f", 1, 0)])
    assert per[0] == "\n2m (fio, tierkv)"
    assert per[1].split() == ["2", "1", "r", "0.50x", "t/f", "0.50x"]


def test_passes_ratio_and_rows():
    assert st.passes(100, 4, 1000, "64k") == 7  # 400 MiB / 62.5 MiB per pass
    assert st.passes(0, 4, 1000, "64k") == 1
    assert st.ratio(5, 0) == "5.00x"
    assert st.ratio(3, 2) == "1.50x"
    assert st.replay_row("t", "4000", .5, .6, .7, .75, .8) == \
        "| t | 4,000 | 0.5000 | 0.6000 | 0.7000 | 0.7500 | 0.8000 | +0.0500 | 0.0500 |"


def test_full_store_row(tmp_path):
    f = tmp_path / "rows"
    f.write_text(f"{st.MIB},1e6,2e6,3e6,0,0 {st.MIB},2e6,3e6,4e6,8,6\n"
                 f"{st.MIB},1e6,2e6,3e6,0,0 {2 * st.MIB},2e6,3e6,4e6,8,8\n")
    row = st.full_store_row("ext4", "direct", "2m", st.read_rows(f))
    assert row == ("| ext4 | 2m | direct | 1 | 2 | 1.50x (1.00x  2.00x) | 1.0 / 2.0 / 3.0 "
                   "| 2.0 / 3.0 / 4.0 | 8 (7 reused) |")


def test_cli():
    assert cli("size", "2m") == (0, "2097152", "")
    assert cli("median-row", "A", "B", "1 2 3", "4 5 6")[1] == "| A | B | 2 | 5 | 0.40x |"
    assert cli("median", "3", "1000", "2000")[1] == "1,000"
    assert cli("fio-json", "read", stdin="x " + fio_report(7, 1, 2, 3))[1] == "7.0,1.0,2.0,3.0"
    assert cli("fio-mibs", "read", stdin=fio_report(3 * st.MIB, 1, 2, 3))[1] == "3"
    assert cli("ops-per-sec", stdin=json.dumps(bench_report()))[1] == "12.5"
    assert cli("field", "hit_ratio", "--format", ".4f", "--check", "read_misses",
               stdin=json.dumps(bench_report()))[1] == "0.1235"
    assert cli("bench-json", "write", "--check", "errors", "--extra", "evictions",
               stdin=json.dumps(bench_report()))[1] == "2048.0,20.0,40.0,60.0,7.0"


def test_cli_fails_loudly():
    rc, out, err = cli("bench-json", "read", "--check", "misses",
                       stdin=json.dumps(bench_report(misses=3)))
    assert rc == 1 and out == "" and "misses=3" in err
    rc, out, err = cli("fio-json", "read", stdin="fio: failed\n")
    assert rc == 1 and "no JSON report" in err
    assert cli("size", "12q")[0] == 1


def test_ttft_row():
    doc = {"prompt_tokens": 1024, "shared_tokens": 768, "cached_blocks": 3,
           "ttft_cold_ms": 300.4, "ttft_cached_ms": 100.0, "logits_max_abs_diff": 0.0,
           "continuation_identical": True,
           "request2": {"load_ms": 1.234, "rebuild_ms": 2.5, "prefill_rest_ms": 90.6}}
    assert st.ttft_row(doc, "warm") == \
        "| 1024 | 768 | warm | 3 | 300 | 100 | 1.23 | 2.50 | 91 | 3.00x | 0 | True |"
    rc, out, _ = cli("ttft-row", "cold", stdin=json.dumps(doc))
    assert rc == 0 and out.startswith("| 1024 | 768 | cold | 3 |")


def test_fresh_put_table(tmp_path):
    rows = tmp_path / "rows"
    rows.write_text("naive 100 0x256; default 120 1x256; baseline 100 2x256;\n"
                    "naive 110 0x256; default 100 1x256; baseline 125 2x256;\n")
    out = st.fresh_put_table("64k", 8192, str(rows)).splitlines()
    assert out[2] == "| 64k | 8192 | naive (flat) | 0x256 | 105 | 1.00x |  |"
    # The median of the per-round ratios (1.2 and 0.91), not the ratio of the medians.
    assert out[3] == "| 64k | 8192 | default | 1x256 | 110 | 1.05x | 0.91-1.20x |"
    assert out[4].startswith("| 64k | 8192 | baseline | 2x256 | 112 | 1.07x |")
    assert out[-1] == "64k: default / baseline 1.00x (spread 0.80-1.20x)"
