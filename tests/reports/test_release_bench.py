"""The release report's performance gate on a GPU without baselines of its own: judged by its
class's baseline where one exists (as ratios to each run's floors), blocked naming the missing
baseline where none does; the host-cost section is then required as for a baselined GPU."""

from __future__ import annotations

import pytest

from selgate.bench import host, regression, tables

from tests.bench.test_bench_host import good_rows
from tests.bench.test_bench_regression import DEVICE, H200, a_run, classed  # noqa: F401 (fixture)
from tests.reports.test_reports_gate import gated_tree, passing_cases, run_gate, write_lane  # noqa: F401 (fixture)


def lanes(tmp_path, **stamp):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    sm90 = passing_cases() + [("conformance/test_conformance.py::test_bf16", "pass", "dtype", 1)]
    write_lane(tmp_path / "res", "sm90", sm90, gpu=H200, **stamp)


@pytest.mark.parametrize(
    "stamp",
    [{"gpu_class": "sm90", "gpu_capability": "9.0"}, {}, {"gpu_class": "none"}],
    ids=["classed", "unclassed", "class none"],
)
def test_a_gpu_with_neither_baseline_blocks_the_release_naming_it(tmp_path, capsys, monkeypatch, stamp, gated_tree):  # noqa: F811
    from selgate.kernels import config

    monkeypatch.setattr(tables, "RESULTS_DIR", tmp_path / "bench" / "results")
    monkeypatch.setattr(config, "CONFIG_DIR", tmp_path / "configs")
    (tmp_path / "configs" / "classes").mkdir(parents=True)
    (tmp_path / "configs" / "classes" / "sm90.yaml").write_text(f'capabilities: ["9.0"]\nbench_baseline: {DEVICE}\n')
    monkeypatch.chdir(tmp_path)
    lanes(tmp_path, **stamp)
    assert run_gate(tmp_path, command="release") == 1
    out = capsys.readouterr().out
    cls = "sm90" if stamp.get("gpu_class") == "sm90" else "(unknown)"
    assert out.startswith(
        f"GATE BLOCKED: benchmark {H200}: no committed baseline for {H200} (bench/results/nvidia-h200/) nor for its class "
        f"{cls}: run python -m selgate.bench sel --sweep full and python -m selgate.bench baseline"
    )
    assert "host cost" not in out  # one root cause, one line: the host section only reads "not measured"
    text = (tmp_path / "out" / "release.md").read_text()
    assert f"### Performance vs baseline: {H200}" in text and "not measured: no host.csv" in text


@pytest.mark.parametrize("stamp", [{"gpu_class": "sm90"}, {"gpu_capability": "9.0"}])
def test_a_class_baseline_judges_the_gpu_and_requires_its_host_cost(tmp_path, capsys, classed, stamp, gated_tree):  # noqa: F811
    """The H200's run equal to the H100's in ratios: the comparison passes, vs the class baseline;
    its host.csv is then required (missing: blocks), and with it the release passes."""
    classed(a_run(copy_gbps=4800, matmul_tflops=800))
    lanes(tmp_path, **stamp)
    assert run_gate(tmp_path, command="release") == 1
    out = capsys.readouterr().out
    assert out.startswith(f"GATE BLOCKED: host cost {H200}: not measured: no host.csv of {H200}")
    assert f"benchmark {H200}" not in out
    text = (tmp_path / "out" / "release.md").read_text()
    assert f"### Performance {regression.Standing('class', 'sm90', DEVICE, []).against}: {H200}" in text
    host.write_csv(good_rows(), tables.results_dir(H200, "2026-12-01") / "host.csv")
    assert run_gate(tmp_path, command="release") == 1
    assert capsys.readouterr().out.startswith("GATE BLOCKED: lane sm90: no perf smoke")
    smoke(tmp_path, a_run(copy_gbps=4800, matmul_tflops=800))
    assert run_gate(tmp_path, command="release") == 0, capsys.readouterr().out
    assert "### Perf smoke of lane sm90" in (tmp_path / "out" / "release.md").read_text()


def smoke(tmp_path, rows, commit="abc123"):
    """The sm90 lane's perf smoke CSV where the lane runner leaves it, its rows measured on `commit`."""
    rows = [{**r, "software": f"torch 2.11.0 triton 3.6.0 driver 580.159.04 commit {commit}"} for r in rows]
    return tables.write_csv(rows, tmp_path / "res" / "sm90" / "perf" / "smoke.csv")


@pytest.fixture
def judged_h200(tmp_path, classed, gated_tree):  # noqa: F811
    """An H200 whose sweep and host cost pass against the class baseline; only its smoke is left to judge."""
    classed(a_run(copy_gbps=4800, matmul_tflops=800))
    host.write_csv(good_rows(), tables.results_dir(H200, "2026-12-01") / "host.csv")
    lanes(tmp_path, gpu_class="sm90")


def test_a_perf_smoke_slower_than_the_class_baseline_blocks_the_release(tmp_path, capsys, judged_h200):
    """Our rows 2x slower than the H100's run on the copy floor, 1.25x on the matmul rate (the H200's
    memory is 1.6x faster, its math the same): the sweep passed, the smoke blocks."""
    smoke(tmp_path, a_run(copy_gbps=4800, matmul_tflops=800, scale=2.0))
    assert run_gate(tmp_path, command="release") == 1
    out = capsys.readouterr().out
    first = "GATE BLOCKED: perf smoke sm90: decode L=512 few / sdpa: 2.00x on the copy floor, 1.25x on the matmul rate"
    assert out.startswith(first), out
    assert "(and 3 more)" in out  # the other rows of ours: the report lists them
    assert "decode L=1024 many | triton | 0.4167 | 0.5208 | 2.000 | 1.250" in (tmp_path / "out" / "release.md").read_text()


def test_a_perf_smoke_of_another_commit_or_of_nothing_blocks(tmp_path, capsys, judged_h200):
    smoke(tmp_path, a_run(copy_gbps=4800, matmul_tflops=800), commit="def456")
    assert run_gate(tmp_path, command="release") == 1
    assert capsys.readouterr().out.startswith("GATE BLOCKED: perf smoke sm90: measured commit def456, the lane ran abc123")
    rows = [{**r, "config": "decode L=4096 few"} for r in a_run(copy_gbps=4800, matmul_tflops=800)]
    smoke(tmp_path, rows)
    assert run_gate(tmp_path, command="release") == 1
    assert "holds none of the smoke's 3 rows" in capsys.readouterr().out


def test_a_perf_smoke_that_failed_a_row_of_ours_blocks(tmp_path, capsys, judged_h200):
    rows = a_run(copy_gbps=4800, matmul_tflops=800)
    rows[1] = {**rows[1], "status": "error", "note": "CUDA error: out of memory"}
    smoke(tmp_path, rows)
    assert run_gate(tmp_path, command="release") == 1
    out = capsys.readouterr().out
    assert "perf smoke sm90: decode L=512 few / triton: measured vs class sm90" in out and "out of memory" in out
