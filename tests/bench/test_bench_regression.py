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

DATA = Path(__file__).parents[1] / "data" / "bench"
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


def test_a_device_with_no_baseline_and_no_class_blocks_naming_what_is_missing(tmp_path, monkeypatch, capsys):
    """Never "nothing to compare": without a baseline of its own or of its class the gate blocks,
    and `compare` exits 1."""
    monkeypatch.setattr(tables, "RESULTS_DIR", tmp_path / "bench" / "results")
    monkeypatch.chdir(tmp_path)
    cmp = regression.compare_to_baseline("NVIDIA H200")
    assert cmp.rows == [] and cmp.blocking == [
        "no committed baseline for NVIDIA H200 (bench/results/nvidia-h200/) nor for its class (unknown): "
        "run python -m selgate.bench sel --sweep full and python -m selgate.bench baseline"
    ]
    assert "the GPU class is unknown: pass `--class`" in cmp.markdown()
    assert main(["compare", "--device", "NVIDIA H200"]) == 1
    out = capsys.readouterr().out
    assert "1 blocking:" in out and "no committed baseline for NVIDIA H200" in out and "nothing to compare" not in out


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


# A GPU class whose baseline device is the H100; the runs below are synthetic rows of one decode
# shape: 1 GB of K/V and q/o read, 100 GFLOP, on an H100-like run (3000 GB/s, 800 TFLOP/s).
H200 = "NVIDIA H200"
IO_BYTES, FLOPS = 1e9, 1e11
CONFIGS = ("decode L=512 few", "decode L=1024 many")


def run_row(config, method, ms, *, copy_gbps, matmul_tflops, ours=True, device=H200, graph_ms=None):
    """One results row timed at `ms`, its fractions computed from the run's own rates as `sel` does."""
    floor_copy, floor_mm = IO_BYTES / (copy_gbps * 1e6), FLOPS / (matmul_tflops * 1e9)  # ms
    return {
        "config": config, "kind": "decode", "method": method, "ours": ours, "status": "ok",
        "ms": ms, "ms_lo": ms * 0.99, "ms_hi": ms * 1.01, "iters": 100, "host_ms": ms * 0.2, "graph_ms": graph_ms,
        "io_bytes": int(IO_BYTES), "gbps": IO_BYTES / (ms * 1e6), "tflops": FLOPS / (ms * 1e9),
        "frac_copy": floor_copy / ms, "frac_matmul": floor_mm / ms, "note": "", "device": device,
        "copy_gbps": copy_gbps, "matmul_tflops": matmul_tflops, "software": "torch 2.11.0 commit abc1234",
    }  # fmt: skip


def a_run(*, copy_gbps, matmul_tflops, scale=1.0, device=H200, graph=False):
    """Rows of ours (sdpa, triton: memory-bound, 80% of the copy floor) and a torch baseline;
    each time is what the run's rates give, times `scale`; sdpa is 10x triton (speedups)."""
    rows = []
    for config in CONFIGS:
        t = IO_BYTES / (copy_gbps * 1e6) / 0.8 * scale
        tri = run_row(config, "triton", t, copy_gbps=copy_gbps, matmul_tflops=matmul_tflops, device=device,
                      graph_ms=0.9 * t if graph else None)  # fmt: skip
        sdpa = run_row(config, "sdpa", 10 * t, copy_gbps=copy_gbps, matmul_tflops=matmul_tflops, device=device)
        torch_row = run_row(
            config, "gather_sdpa", 20 * t, copy_gbps=copy_gbps, matmul_tflops=matmul_tflops, ours=False, device=device
        )
        tri["speedups"] = "sdpa=10;gather_sdpa=20"
        rows += [sdpa, tri, torch_row]
    return rows


@pytest.fixture
def classed(tmp_path, monkeypatch):
    """configs/classes/sm90.yaml naming the H100 as bench_baseline, the H100's committed baseline
    `full` (3000 GB/s, 800 TFLOP/s); returns a writer of the H200's latest `full.csv`."""
    from selgate.kernels import config

    monkeypatch.setattr(tables, "RESULTS_DIR", tmp_path / "results")
    monkeypatch.setattr(config, "CONFIG_DIR", tmp_path / "configs")
    (tmp_path / "configs" / "classes").mkdir(parents=True)
    (tmp_path / "configs" / "classes" / "sm90.yaml").write_text(f'capabilities: ["9.0"]\nbench_baseline: {DEVICE}\n')
    (tmp_path / "configs" / "classes" / "sm89.yaml").write_text('capabilities: ["8.9"]\n')
    tables.write_csv(a_run(copy_gbps=3000, matmul_tflops=800, device=DEVICE), regression.baseline_path(DEVICE, "full"))

    def latest(rows, date="2026-12-01"):
        return tables.write_csv(rows, tables.results_dir(H200, date) / "full.csv")

    return latest


AGAINST = "vs class sm90 baseline (NVIDIA H100 80GB HBM3), as ratios to this run's floors"


def test_faster_memory_equal_in_ratios_passes_against_the_class_baseline(classed):
    """The H200's memory is 1.6x faster: its times are 1.6x shorter, its matmul fraction better,
    its copy fraction the H100's. Compared, not skipped, and nothing blocks."""
    classed(a_run(copy_gbps=4800, matmul_tflops=800))
    cmp = regression.compare_to_baseline(H200, device_class="sm90")
    assert cmp.blocking == [] and cmp.against == AGAINST
    ours = [r for r in cmp.rows if r["ours"]]
    assert len(ours) == 4 and all(r["verdict"] == "ok" for r in ours)
    tri = next(r for r in ours if r["method"] == "triton")
    assert tri["copy"] == pytest.approx(1.0) and tri["matmul"] == pytest.approx(1 / 1.6)
    assert tri["latest_ms"] == pytest.approx(tri["base_ms"] / 1.6)
    assert (tri["base_vs_sdpa"], tri["vs_sdpa"]) == (10.0, 10.0)  # the speedups cell, information
    md = cmp.markdown()
    assert md.startswith(f"### Performance {AGAINST}: {H200}")
    assert f"No regression over 4 measured configurations of ours {AGAINST}." in md
    assert "| 1.000 | 0.625 | 10.00 / 10.00 | ok |" in md
    # the class follows the capability too, as the lane's environment gives it
    assert regression.compare_to_baseline(H200, capability="9.0").against == AGAINST


@pytest.mark.parametrize(
    "copy_gbps, scale, scales",
    [
        (3000, 1.5, "1.50x on the copy floor, 1.50x on the matmul rate"),
        (4800, 2.4, "2.40x on the copy floor, 1.50x on the matmul rate"),
    ],
    ids=["the same rates", "faster memory, 1.5x the H100's time"],
)
def test_a_real_slowdown_on_both_scales_blocks_against_the_class_baseline(classed, capsys, copy_gbps, scale, scales):
    """1.5x slower on both scales: neither the run's memory nor its math explains it."""
    classed(a_run(copy_gbps=copy_gbps, matmul_tflops=800, scale=scale))
    cmp = regression.compare_to_baseline(H200, device_class="sm90")
    assert len(cmp.blocking) == 4  # sdpa and triton of both configs; the torch baseline only shown
    tri = next(b for b in cmp.blocking if b.startswith(f"{CONFIGS[0]} / triton"))
    assert tri.startswith(f"{CONFIGS[0]} / triton: {scales} {AGAINST}")
    gather = next(r for r in cmp.rows if r["method"] == "gather_sdpa")
    assert gather["verdict"] == "slower (torch baseline)"
    assert main(["compare", "--device", H200, "--class", "sm90"]) == 1
    assert "4 blocking:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "copy_gbps, matmul_tflops",
    [(3000, 800 / 1.5), (2000, 800)],
    ids=["copy fraction worse, matmul fraction the same", "slower memory: matmul fraction worse"],
)
def test_a_slowdown_on_one_scale_only_passes(classed, copy_gbps, matmul_tflops):
    """1.5x the H100's times: where one of the two floors explains it (the run's copy bandwidth or
    its matmul rate 1.5x lower), that scale reads 1.0 and nothing blocks; the other reads 1.5."""
    rows = a_run(copy_gbps=3000, matmul_tflops=800, scale=1.5)
    for r in rows:  # the same times, measured beside other rates
        r.update(run_row(r["config"], r["method"], r["ms"], copy_gbps=copy_gbps, matmul_tflops=matmul_tflops, ours=r["ours"]))
    classed(rows)
    cmp = regression.compare_to_baseline(H200, device_class="sm90")
    assert cmp.blocking == [], cmp.blocking
    tri = next(r for r in cmp.rows if r["method"] == "triton")
    assert sorted([tri["copy"], tri["matmul"]]) == pytest.approx([1.0, 1.5])
    assert main(["compare", "--device", H200, "--class", "sm90"]) == 0


def test_a_device_slowdown_in_graph_time_blocks_against_the_class_baseline(classed):
    """Eager times equal in ratios, graph-replayed device times 1.5x on both scales: blocks."""
    rows = a_run(copy_gbps=3000, matmul_tflops=800, graph=True)
    for r in rows:
        if r["graph_ms"]:
            r["graph_ms"] *= 1.5
    classed(rows)
    base = regression.baseline_path(DEVICE, "full")
    tables.write_csv(a_run(copy_gbps=3000, matmul_tflops=800, device=DEVICE, graph=True), base)
    cmp = regression.compare_to_baseline(H200, device_class="sm90")
    assert [b.split(":")[0] for b in cmp.blocking] == [f"{c} / triton" for c in CONFIGS]
    assert "device time (CUDA graph) 1.50x on the copy floor" in cmp.blocking[0]


def test_the_class_stands_in_only_where_its_baseline_exists(classed, tmp_path):
    """Class sm89 names no bench_baseline; a class whose baseline matrix has no run here blocks;
    a device with a baseline of its own is judged by it alone."""
    classed(a_run(copy_gbps=4800, matmul_tflops=800))
    cmp = regression.compare_to_baseline(H200, device_class="sm89")
    assert cmp.blocking[0].startswith("no committed baseline for NVIDIA H200 (")
    assert "nor for its class sm89: run" in cmp.blocking[0]
    assert "configs/classes/sm89.yaml names no `bench_baseline` device" in cmp.markdown()
    tables.write_csv(a_run(copy_gbps=3000, matmul_tflops=800, device=DEVICE), regression.baseline_path(DEVICE, "launch"))
    cmp = regression.compare_to_baseline(H200, device_class="sm90")
    assert cmp.blocking == [f"baseline-launch.csv of class sm90 ({DEVICE}): no `launch.csv` run under "
                            f"{tables.RESULTS_DIR / 'nvidia-h200'}; run the same matrix again"]  # fmt: skip
    own = a_run(copy_gbps=4800, matmul_tflops=800)
    tables.write_csv(own, regression.baseline_path(H200, "full"))
    cmp = regression.compare_to_baseline(H200, device_class="sm90")
    assert cmp.against is None and cmp.blocking == [] and cmp.markdown().startswith(f"### Performance vs baseline: {H200}")


def test_a_row_without_floors_cannot_pass_against_the_class_baseline(classed):
    rows = a_run(copy_gbps=4800, matmul_tflops=800)
    for r in rows:
        if r["method"] == "triton":
            r.update(frac_copy=None, frac_matmul=None, tflops=None, io_bytes=None)
    classed(rows)
    cmp = regression.compare_to_baseline(H200, device_class="sm90")
    assert len(cmp.blocking) == 2 and "the latest run recorded no copy or matmul floor" in cmp.blocking[0]
