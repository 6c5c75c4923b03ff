"""The release gate's regression rule on recorded CSVs.

`baseline_cpu.csv` is a real CPU run; `latest_cpu.csv` is that run with four recorded
changes (median and interval scaled together): sdpa on `L=16 few` 1.25x slower (blocks),
sdpa on `L=16 many` 1.05x (passes),
masked_sdpa on `L=64 few` 1.5x (a torch baseline: shown, never blocks), sdpa on
`L=64 many` failed (blocks), and gather_sdpa on `L=64 few` not measured (listed only)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from selgate.bench import regression, tables
from selgate.bench.__main__ import main

DATA = Path(__file__).parent / "data" / "bench"
DEVICE = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def results(tmp_path, monkeypatch):
    """A results tree holding the recorded baseline and latest run of DEVICE."""
    monkeypatch.setattr(tables, "RESULTS_DIR", tmp_path)
    root = tmp_path / "nvidia-h100-80gb-hbm3"
    (root / "2026-11-21").mkdir(parents=True)
    (root / "2026-11-22").mkdir()
    shutil.copy(DATA / "baseline_cpu.csv", root / "baseline-sweep.csv")
    shutil.copy(DATA / "baseline_cpu.csv", root / "2026-11-21" / "sweep.csv")
    shutil.copy(DATA / "latest_cpu.csv", root / "2026-11-22" / "sweep.csv")
    shutil.copy(DATA / "baseline_cpu.csv", root / "2026-11-22" / "launch.csv")  # another matrix, run later
    return root


def short(config: str) -> str:
    """'decode N=4 ... L=16 S_kv=64 few float32' -> 'L=16 few'."""
    m = re.search(r"(L=\d+) S_kv=\d+ (\w+)", config)
    return f"{m[1]} {m[2]}"


def test_rule_on_recorded_csvs():
    base, latest = tables.read_csv(DATA / "baseline_cpu.csv"), tables.read_csv(DATA / "latest_cpu.csv")
    rows, blocking = regression.compare_rows(base, latest)
    verdicts = {(short(r["config"]), r["method"]): r["verdict"] for r in rows}
    assert verdicts[("L=16 few", "sdpa")] == "BLOCKING"
    assert verdicts[("L=16 many", "sdpa")] == "ok"
    assert verdicts[("L=64 few", "masked_sdpa")] == "slower (torch baseline)"
    assert verdicts[("L=64 many", "sdpa")] == "error"
    assert verdicts[("L=64 few", "gather_sdpa")] == "not measured"
    assert len(blocking) == 2
    slow = next(b for b in blocking if "L=16" in b)
    assert "0.3916 ms" in slow and "0.4895 ms" in slow and "1.25x" in slow  # both numbers shown
    assert "recorded failure" in next(b for b in blocking if "L=64" in b)


def test_identical_results_do_not_block():
    base = tables.read_csv(DATA / "baseline_cpu.csv")
    rows, blocking = regression.compare_rows(base, base)
    assert blocking == [] and all(r["ratio"] == 1.0 for r in rows)


def test_threshold_is_exclusive_at_ten_percent():
    base = tables.read_csv(DATA / "baseline_cpu.csv")[:1]
    for factor, blocks in ((1.10, False), (1.1001, True)):  # the whole distribution shifted, beyond noise
        latest = [{**base[0], "ms": base[0]["ms"] * factor, "ms_lo": base[0]["ms_hi"] * 1.001}]
        assert bool(regression.compare_rows(base, latest)[1]) is blocks, factor


def test_compare_to_baseline_uses_newest_run_of_the_same_matrix(results):
    cmp = regression.compare_to_baseline(DEVICE)
    assert cmp.pairs == [(results / "baseline-sweep.csv", results / "2026-11-22" / "sweep.csv")]
    assert len(cmp.blocking) == 2
    md = cmp.markdown()
    assert "| config | method | baseline ms | latest ms | ratio | verdict |" in md
    assert "0.3916 | 0.4895 | 1.250 | BLOCKING" in md
    assert "1 baseline configurations were not measured" in md
    assert "masked_sdpa | 0.0963 | 0.1445 | 1.500 | slower (torch baseline)" in md
    assert "| gather_sdpa |" not in md.split("not measured |")[-1]  # torch rows within 10% are left out
    short_md = cmp.markdown(max_rows=2)
    assert short_md.count("\n| decode") == 2 and "more rows with smaller ratios" in short_md
    assert regression.compare_to_baseline("nvidia-h100-80gb-hbm3").blocking == cmp.blocking  # slug works too


def test_missing_baseline_is_reported_not_blocking(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "RESULTS_DIR", tmp_path)
    cmp = regression.compare_to_baseline("NVIDIA A100-SXM4-80GB")
    assert cmp.blocking == [] and cmp.rows == []
    assert "no committed baseline" in cmp.markdown()


def test_a_baseline_without_a_new_run_blocks(results):
    (results / "baseline-full.csv").write_bytes((DATA / "baseline_cpu.csv").read_bytes())
    cmp = regression.compare_to_baseline(DEVICE)
    assert len(cmp.pairs) == 2 and len(cmp.blocking) == 3
    assert cmp.blocking[0].startswith("baseline-full.csv: no `full.csv` run")
    assert "`sweep.csv` measured commit" in cmp.markdown()


def test_compare_and_baseline_commands(results, capsys):
    assert main(["compare", "--device", DEVICE]) == 1
    assert "2 blocking" in capsys.readouterr().out
    assert main(["baseline", str(results / "2026-11-22" / "sweep.csv"), "--device", DEVICE]) == 0
    assert main(["compare", "--device", DEVICE]) == 0


def test_a_host_bound_slowdown_is_reported_but_does_not_block():
    """A sample whose host issue time reached the timed median measured Python, not the
    kernel: shown as host-bound; the same slowdown with the GPU busy blocks."""
    base = [{"config": "c", "method": "triton", "ours": True, "status": "ok", "ms": 0.10}]
    host = [{**base[0], "ms": 0.30, "host_ms": 0.29}]
    device = [{**base[0], "ms": 0.30, "host_ms": 0.05}]
    rows, blocking = regression.compare_rows(base, host)
    assert blocking == [] and rows[0]["verdict"].startswith("slower, host-bound (host 0.2900")
    rows, blocking = regression.compare_rows(base, device)
    assert rows[0]["verdict"] == "BLOCKING" and len(blocking) == 1


def test_a_host_bound_slowdown_beyond_the_host_spread_blocks():
    """Host-bound, but 24x slower (packed SDPA when cuDNN planned every new shape): a slower
    host does not explain it."""
    base = [{"config": "c", "method": "sdpa", "ours": True, "status": "ok", "ms": 2.74}]
    stalled = [{**base[0], "ms": 65.75, "host_ms": 65.67}]
    rows, blocking = regression.compare_rows(base, stalled)
    assert rows[0]["verdict"].startswith("BLOCKING, host-bound beyond 4x") and len(blocking) == 1
    assert "(24.00x)" in blocking[0]
    within = [{**base[0], "ms": 2.74 * regression.HOST_SPREAD, "host_ms": 2.7 * regression.HOST_SPREAD}]
    assert regression.compare_rows(base, within)[1] == []


def test_a_slowdown_within_the_intervals_overlap_does_not_block():
    base = [
        {"config": "c", "method": "sdpa", "ours": True, "status": "ok", "ms": 2.04, "ms_lo": 1.98, "ms_hi": 2.43, "iters": 10}
    ]
    noisy = [{**base[0], "ms": 2.45, "ms_lo": 2.18, "ms_hi": 3.10, "host_ms": 0.5}]
    clear = [{**noisy[0], "ms_lo": 2.44}]
    rows, blocking = regression.compare_rows(base, noisy)
    assert blocking == [] and rows[0]["verdict"].startswith("slower, within noise")
    rows, blocking = regression.compare_rows(base, clear)
    assert rows[0]["verdict"] == "BLOCKING" and len(blocking) == 1


@pytest.mark.parametrize("base_iters, latest_iters", [(9, 10), (10, 9), (None, 100)])
def test_an_interval_from_too_few_samples_excuses_nothing(base_iters, latest_iters):
    base = [
        {
            "config": "c",
            "method": "sdpa",
            "ours": True,
            "status": "ok",
            "ms": 2.04,
            "ms_lo": 1.98,
            "ms_hi": 2.43,
            "iters": base_iters,
        }
    ]
    noisy = [{**base[0], "ms": 2.45, "ms_lo": 2.18, "ms_hi": 3.10, "host_ms": 0.5, "iters": latest_iters}]
    rows, blocking = regression.compare_rows(base, noisy)
    assert rows[0]["verdict"] == "BLOCKING" and len(blocking) == 1


def test_an_eager_slowdown_with_the_device_time_within_the_baseline_does_not_block():
    """Eagerly 3x slower with the host at 85% of the call (below the host-bound cut): the
    graph-replayed device time decides; within 10% of the baseline it is the host's slowdown."""
    base = [{"config": "c", "method": "cuda", "ours": True, "status": "ok", "ms": 0.10}]
    latest = [{**base[0], "ms": 0.30, "host_ms": 0.255, "graph_ms": 0.105}]
    rows, blocking = regression.compare_rows(base, latest)
    assert blocking == [] and rows[0]["verdict"] == ("slower eagerly, device time within the baseline (graph 0.1050 ms)")
    latest[0]["graph_ms"] = 0.12  # the device itself got 20% slower
    rows, blocking = regression.compare_rows(base, latest)
    assert rows[0]["verdict"] == "BLOCKING" and len(blocking) == 1
    base[0]["graph_ms"] = 0.05  # a graph-timed baseline: 0.105 ms is 2.1x its device time
    latest[0]["graph_ms"] = 0.105
    rows, blocking = regression.compare_rows(base, latest)
    assert rows[0]["verdict"] == "BLOCKING on the device (graph 0.0500 -> 0.1050 ms)" and len(blocking) == 1


@pytest.mark.parametrize("latest_graph, blocks", [(0.0270, True), (0.0236, False)])
def test_a_device_slowdown_under_host_bound_eager_times_blocks(latest_graph, blocks):
    """The H100 case: a decode launch change made rows 1.26x slower on the device (graph 0.0215
    -> 0.0270 ms) while both eager medians were the host's (~0.1 ms), equal within 10%."""
    base = [{"config": "c", "method": "cuda", "ours": True, "status": "ok", "ms": 0.100, "host_ms": 0.098, "graph_ms": 0.0215}]
    latest = [{**base[0], "ms": 0.102, "host_ms": 0.100, "graph_ms": latest_graph}]
    rows, blocking = regression.compare_rows(base, latest)
    assert (len(blocking) == 1) is blocks
    assert rows[0]["verdict"] == ("BLOCKING on the device (graph 0.0215 -> 0.0270 ms)" if blocks else "ok")
    if blocks:
        assert blocking[0] == "c / cuda: device time (CUDA graph) baseline 0.0215 ms, latest 0.0270 ms (1.26x)"


def test_a_results_csv_with_a_bad_number_names_its_line_and_column(tmp_path):
    lines = (DATA / "baseline_cpu.csv").read_text().splitlines()
    head = lines[0].split(",")
    cells = lines[2].split(",")
    cells[head.index("ms")] = "fast"
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([lines[0], lines[1], ",".join(cells)]) + "\n")
    with pytest.raises(ValueError, match=r"bad.csv: line 3, column ms: expected a number, got 'fast'"):
        tables.read_csv(bad)


def test_graph_rows_beyond_the_threshold_are_re_timed_and_the_median_kept():
    """A transient that slowed one row's whole graph sample is outvoted by two more timings; a
    slowdown that reproduces keeps blocking; rows within 10%, torch rows and rows without a
    graph-timed baseline are not re-timed."""

    def row(config, method="cuda", ours=True, graph=0.0036):
        return {"config": config, "method": method, "ours": ours, "status": "ok", "ms": 0.1, "graph_ms": graph}

    base = [row("transient"), row("real"), row("within"), row("torch", "sdpa", False), row("no base graph", graph=None)]
    latest = [
        row("transient", graph=0.0078),
        row("real", graph=0.0050),
        row("within", graph=0.0039),
        row("torch", "sdpa", False, graph=0.0090),
        row("no base graph", graph=0.0090),
    ]
    again = {"transient": [0.0037, 0.0036], "real": [0.0049, 0.0036]}
    asked = []

    def retime(r):
        asked.append(r["config"])
        return again[r["config"]].pop(0)

    assert regression.recheck_graph(latest, base, retime) == 2
    assert asked == ["transient", "transient", "real", "real"]
    by = {r["config"]: r for r in latest}
    assert by["transient"]["graph_ms"] == 0.0037 and by["real"]["graph_ms"] == 0.0049
    assert by["transient"]["note"] == "graph re-timed: 0.0078, 0.0037, 0.0036 ms, median kept"
    rows, blocking = regression.compare_rows(base, latest)
    assert [b.split(" / ")[0] for b in blocking] == ["real"]


def test_a_failed_re_timing_keeps_the_first_timing_and_the_sweep():
    base = [{"config": "c", "method": "cuda", "ours": True, "status": "ok", "ms": 0.1, "graph_ms": 0.0036}]
    latest = [{**base[0], "graph_ms": 0.0078, "note": "an earlier note"}]

    def retime(r):
        raise RuntimeError("CUDA out of memory\nmore")

    assert regression.recheck_graph(latest, base, retime) == 0
    assert latest[0]["graph_ms"] == 0.0078
    assert latest[0]["note"] == "an earlier note; graph re-time failed (RuntimeError: CUDA out of memory), first timing kept"
    assert len(regression.compare_rows(base, latest)[1]) == 1  # unconfirmed, still blocking
