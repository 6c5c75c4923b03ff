"""`selgate bench host` on a CPU machine: its command line, the bars on hand-made rows, its CSV,
and the release report's host-cost section."""

from __future__ import annotations

import os
import types

import pytest
import torch

from selgate.bench import host, regression, tables
from selgate.bench.__main__ import main
from selgate.reference import normalize_ranges
from selgate.reports.release import bench_sections

from tests.reports.test_reports_gate import gated_tree, passing_cases, run_gate, write_lane  # noqa: F401 (fixture)

GPU = "Fake GPU"


def row(shape, path, host_us=None, wall_us=None, graph_us=None, status="ok", note=""):
    return dict.fromkeys(host.COLUMNS) | {
        "shape": shape, "path": path, "status": status, "host_us": host_us, "wall_us": wall_us, "graph_us": graph_us,
        "note": note,
    }  # fmt: skip


def good_rows() -> list[dict]:
    """Every bar met: host 1.5-1.8x sdpa's (auto) and 1.2-1.4x (cuda) on a and b, eager 1.2x
    and 1.3x the graph on c."""
    rows = []
    for s in "ab":
        rows += [row(s, "sdpa", 10.0), row(s, "auto", 18.0), row(s, "auto_normalized", 15.0)]
        rows += [row(s, "cuda", 14.0), row(s, "cuda_normalized", 12.0)]
    return rows + [
        row("c", "auto", 20.0, wall_us=65.0, graph_us=50.0),
        row("c", "auto_normalized", 20.0, wall_us=60.0, graph_us=50.0),
    ]


def verdicts(lines: list[str]) -> dict:
    """{(shape, path): PASS|FAIL} of host_checks lines '- VERDICT shape / path: ...'."""
    out = {}
    for line in lines:
        verdict, shape, _, path = line[2:].split(":")[0].split(" ")
        out[(shape, path)] = verdict
    return out


def host_lines(rows=None):
    return host.host_checks(good_rows() if rows is None else rows)


def test_help_needs_no_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        main(["host", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "selgate.bench host [-h]" in out and "--calls" in out and "--warmup" in out


def test_without_cuda_it_exits_2_saying_why(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["host", "--out", str(tmp_path / "host.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device" in err
    assert not (tmp_path / "host.csv").exists()


def test_the_paths_take_turns_within_each_round():
    """Every round times one loop of each path in turn, so a drift of the host's speed during
    the run moves SDPA's time with the others' instead of one path's ratio."""
    log = []
    calls = {p: (lambda p=p: log.append(p)) for p in ("sdpa", "auto", "cuda")}
    times = host.interleaved_us(calls, 3, sync=lambda: None)
    rounds = [log[i : i + 9] for i in range(0, len(log), 9)]
    assert len(rounds) == host.REPEATS and all(r == ["sdpa"] * 3 + ["auto"] * 3 + ["cuda"] * 3 for r in rounds)
    assert set(times) == set(calls) and all(h > 0 and w >= h for h, w in times.values())


def test_a_run_keeps_every_path_as_a_row(monkeypatch):
    """A path that raises, or cannot run here, is a row with its status; the others are timed
    together and captured in a graph."""
    p = host.SHAPES["a"][0]
    monkeypatch.setattr(host, "SHAPES", {"a": host.SHAPES["a"]})
    monkeypatch.setattr(host, "shape_inputs", lambda name, device: types.SimpleNamespace(ranges=torch.zeros(1, 1, 1, 8, 2)))

    def broken():
        raise RuntimeError("no kernel here")

    paths = {"sdpa": lambda: None, "auto": lambda: None, "cuda": broken, "triton": "unsupported: x"}
    monkeypatch.setattr(host, "paths", lambda x: paths)
    monkeypatch.setattr(host, "run_environment", lambda: {"torch": "t", "triton": "tr", "commit": "c"})
    monkeypatch.setattr(host, "current_device_name", lambda: GPU)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(host, "time_graph", lambda calls, device: types.SimpleNamespace(median_ms=0.01))
    rows = {r["path"]: r for r in host.bench(calls=2, warmup=1)}
    assert rows["cuda"]["status"] == "error: RuntimeError: no kernel here" and rows["cuda"]["host_us"] is None
    assert rows["triton"]["status"] == "unsupported: x"
    for path in ("sdpa", "auto"):
        assert rows[path]["status"] == "ok" and rows[path]["host_us"] > 0 and rows[path]["graph_us"] == 10.0
    assert rows["auto"]["host_x_sdpa"] == rows["auto"]["host_us"] / rows["sdpa"]["host_us"] and rows["auto"]["B"] == p.B


def test_the_bars_on_rows_that_meet_them():
    assert host_lines() == [
        "- PASS a / auto: host 18.0 us/call = 1.80x sdpa's 10.0 us (bar 2x)",
        "- PASS a / auto_normalized: host 15.0 us/call = 1.50x sdpa's 10.0 us (bar 2x)",
        "- PASS a / cuda: host 14.0 us/call = 1.40x sdpa's 10.0 us (bar 1.5x)",
        "- PASS a / cuda_normalized: host 12.0 us/call = 1.20x sdpa's 10.0 us (bar 1.5x)",
        "- PASS b / auto: host 18.0 us/call = 1.80x sdpa's 10.0 us (bar 2x)",
        "- PASS b / auto_normalized: host 15.0 us/call = 1.50x sdpa's 10.0 us (bar 2x)",
        "- PASS b / cuda: host 14.0 us/call = 1.40x sdpa's 10.0 us (bar 1.5x)",
        "- PASS b / cuda_normalized: host 12.0 us/call = 1.20x sdpa's 10.0 us (bar 1.5x)",
        "- PASS c / auto: eager 65.0 us/call = 1.30x its graph 50.0 us (bar 1.5x)",
        "- PASS c / auto_normalized: eager 60.0 us/call = 1.20x its graph 50.0 us (bar 1.5x)",
    ]


BARS = [  # (shape, path, the column set, its value at the bar)
    *((shape, path, "host_us", 10.0 * bar) for shape in "ab" for path, bar in host.HOST_BARS.items()),
    ("c", "auto", "wall_us", 75.0),
    ("c", "auto_normalized", "wall_us", 75.0),
]


@pytest.mark.parametrize("shape, path, column, at_bar", BARS)
@pytest.mark.parametrize("delta, verdict", [(-0.01, "PASS"), (0.0, "PASS"), (0.01, "FAIL")])
def test_each_bar_passes_up_to_it_and_fails_just_over(shape, path, column, at_bar, delta, verdict):
    rows = good_rows()
    next(r for r in rows if (r["shape"], r["path"]) == (shape, path))[column] = at_bar + delta
    got = verdicts(host_lines(rows))
    assert got.pop((shape, path)) == verdict
    assert set(got.values()) == {"PASS"}  # the other bars are untouched


def drop(shape, path):
    return [r for r in good_rows() if (r["shape"], r["path"]) != (shape, path)]


def with_row(shape, path, **changes):
    return [r | changes if (r["shape"], r["path"]) == (shape, path) else r for r in good_rows()]


@pytest.mark.parametrize(
    "rows, line",
    [
        (drop("a", "auto_normalized"), "- FAIL a / auto_normalized: not measured (no auto_normalized row)"),
        (
            with_row("b", "cuda_normalized", status="unsupported: no `normalized`", host_us=None),
            "- FAIL b / cuda_normalized: not measured (cuda_normalized: unsupported: no `normalized`)",
        ),
        (drop("b", "sdpa"), "- FAIL b / cuda_normalized: not measured (no sdpa row)"),
        (drop("a", "auto"), "- FAIL a / auto: not measured (no auto row)"),
        (
            with_row("c", "auto_normalized", graph_us=None, note="graph capture failed: RuntimeError: sync"),
            "- FAIL c / auto_normalized: not measured (no graph time: graph capture failed: RuntimeError: sync)",
        ),
        (drop("c", "auto_normalized"), "- FAIL c / auto_normalized: not measured (no auto_normalized row)"),
    ],
)
def test_a_bar_without_its_rows_is_not_measured_and_fails(rows, line):
    assert line in host_lines(rows)


def test_no_rows_fail_every_bar():
    got = verdicts(host_lines([]))
    assert len(got) == 2 * len(host.HOST_BARS) + 2 and set(got.values()) == {"FAIL"}


def test_the_csv_round_trips(tmp_path):
    rows = host.add_ratios(good_rows())
    for i, r in enumerate(rows):
        r |= {"B": i, "G": 8, "h": 16, "D": 128, "S_kv": 8192, "n": 8, "device": GPU, "torch": "2.11.0", "triton": "3.6.0"}
        r |= {"commit": "4" * 40, "date": "2026-12-01", "host_us": r["host_us"] / 3}
    rows[0]["note"] = 'served by "cuda", then | a pipe\nand a second line'
    assert rows[-1]["eager_x_graph"] == 1.2 and rows[1]["host_x_sdpa"] == 1.8 and rows[0]["graph_us"] is None
    path = host.write_csv(rows, tmp_path / "d" / "host.csv")
    assert path.read_text().splitlines()[0] == ",".join(host.COLUMNS)
    assert host.read_csv(path) == rows


def test_spaced_ranges_are_already_normal():
    gen = torch.Generator().manual_seed(1)
    r = host.spaced_ranges(3, 8, 8, 64, 8192, gen)
    assert r.shape == (3, 1, 8, 8, 2) and r.dtype == torch.int32
    assert torch.equal(normalize_ranges(r, 8192), r)  # sorted, disjoint, not adjacent, below S_kv
    assert bool(((r[..., 1] - r[..., 0]) == 64).all())


def test_latest_results_csv_is_never_a_host_csv(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "RESULTS_DIR", tmp_path)
    day = tmp_path / "fake-gpu" / "2026-12-01"
    day.mkdir(parents=True)
    (day / "sel.csv").write_text("config,method,status,ms\n")
    newer = host.write_csv(good_rows(), day / "host.csv")
    os.utime(newer, (newer.stat().st_mtime + 60,) * 2)
    assert tables.latest_csv(GPU) == day / "sel.csv" and tables.latest_csv(GPU, "host") == day / "host.csv"


@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    """tables.RESULTS_DIR moved to tmp_path/results; the baseline comparison a stub with nothing blocking."""
    cmp = types.SimpleNamespace(blocking=[], markdown=lambda: f"### Performance vs baseline: {GPU}\n")
    monkeypatch.setattr(regression, "compare_to_baseline", lambda device: cmp)
    monkeypatch.setattr(tables, "RESULTS_DIR", tmp_path / "results")
    return tmp_path / "results" / "fake-gpu"


def test_the_release_report_shows_the_host_section_and_its_failures_block(tmp_path, capsys, results_dir):
    host.write_csv(with_row("a", "cuda_normalized", host_us=16.0), results_dir / "2026-12-01" / "host.csv")
    write_lane(tmp_path / "res", "cpu", passing_cases())
    sm90 = passing_cases() + [("conformance/test_conformance.py::test_bf16", "pass", "dtype", 1)]
    write_lane(tmp_path / "res", "sm90", sm90, gpu=GPU)
    assert run_gate(tmp_path, command="release") == 1
    assert capsys.readouterr().out.startswith(
        f"GATE BLOCKED: host cost {GPU}: a / cuda_normalized: host 16.0 us/call = 1.60x sdpa's 10.0 us (bar 1.5x)"
    )
    text = (tmp_path / "out" / "release.md").read_text()
    assert f"### Host cost per call: {GPU}" in text and "- PASS c / auto_normalized: eager 60.0 us/call" in text


@pytest.mark.parametrize("baselined", [False, True])
def test_a_missing_host_csv_blocks_only_where_a_baseline_is_committed(results_dir, baselined):
    """As a missing sweep: not measured blocks where the GPU has a committed baseline, not elsewhere."""
    results_dir.mkdir(parents=True)
    if baselined:
        (results_dir / "baseline-full.csv").write_text("config,method,status,ms\n")
    lane = types.SimpleNamespace(environment={"gpu": GPU}, junit=results_dir / "junit.xml")
    sections, blocking = bench_sections({"sm90": lane})
    assert f"### Host cost per call: {GPU}\n\nnot measured: no host.csv of {GPU}" in sections[1]
    host = [b.split(":")[:2] for b in blocking if b.startswith("host cost")]
    assert host == ([["host cost Fake GPU", " not measured"]] if baselined else [])
    assert any(b.startswith("lane sm90: no perf smoke") for b in blocking)  # its own root cause, either way
