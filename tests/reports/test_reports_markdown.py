"""The Markdown report, the merged JUnit and the release report, on synthetic lanes."""

from junitparser import JUnitXml

from selgate.reports.gate import GateVerdict, lane_coverage
from selgate.reports.markdown import render, repro_command, write_report
from selgate.reports.results import load_results, merge

from tests.reports.test_reports_gate import gated_tree, passing_cases, run_gate, write_lane  # noqa: F401 (fixture)

FAIL = ("conformance/test_conformance.py::test_parity[fp16-case3]", "fail", "parity", 3)


def _results(tmp_path):
    write_lane(
        tmp_path / "res", "cpu", passing_cases() + [FAIL, ("conformance/test_conformance.py::test_bf16", "skip", "dtype", None)]
    )
    write_lane(tmp_path / "res", "sm90", passing_cases() + [("conformance/test_conformance.py::test_bf16", "xfail", "dtype", 0)])
    return load_results([tmp_path / "res"])


def test_report_has_the_matrix_failures_with_repro_and_environment(tmp_path):
    results = _results(tmp_path)
    text = render(results, GateVerdict(required_lanes=["cpu"], blocking=["lane cpu: FAIL x"]))
    assert "| family | cpu | sm90 |" in text
    assert "| parity | **1/1/0/0/0** | 1/0/0/0/0 |" in text
    assert "| dtype | 0/0/0/1/0 | 0/0/0/0/1 |" in text
    assert "| **all** | **11/1/0/1/0** | 11/0/0/0/1 |" in text
    assert (
        "- **cpu** fail `conformance/test_conformance.py::test_parity[fp16-case3]` (seed 3): assert 1 == 2\n"
        "  `SELGATE_LANE=cpu TRITON_INTERPRET=1 python -m pytest "
        "'conformance/test_conformance.py::test_parity[fp16-case3]' --size tiny -p no:xdist`"
    ) in text
    assert "| torch | 2.13.0 | 2.13.0 |" in text and "| commit | abc123 | abc123 |" in text


def test_repro_carries_the_emulated_capability_and_overrides(tmp_path):
    write_lane(tmp_path / "res", "sm89-emulated", [FAIL])
    lane = load_results([tmp_path / "res"])["sm89-emulated"]
    env = {**lane.environment, "capability_override": "8.9", "tolerance_overrides": '{"fp16": {"max_factor": 3}}'}
    line = repro_command(lane.cases[0], env)
    assert line.startswith(
        'SELGATE_LANE=sm89-emulated SELGATE_CAPABILITY=8.9 SELGATE_TOL_OVERRIDES=\'{"fp16": {"max_factor": 3}}\' python -m pytest'
    )
    assert line.endswith("--size small -p no:xdist")


def test_report_stays_under_the_byte_limit(tmp_path):
    many = [(f"conformance/test_conformance.py::test_parity[case{i}]", "fail", "parity", i) for i in range(400)]
    write_lane(tmp_path / "res", "cpu", many)
    text = render(load_results([tmp_path / "res"]), GateVerdict(required_lanes=["cpu"], blocking=["x"]), max_bytes=20_000)
    assert len(text.encode()) <= 20_000
    assert "more failures omitted to stay under 20000 bytes" in text
    assert "## Environment" in text


def test_step_summary_is_appended_within_its_limit(tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    write_report("# report\n", tmp_path / "out" / "report.md")
    assert summary.read_text() == "earlier step\n# report\n"
    summary.write_text("x" * (1024 * 1024 - 10))
    write_report("# a report too large for what is left\n", tmp_path / "out" / "report.md")
    assert summary.stat().st_size <= 1024 * 1024 + 100 and "does not fit the step summary" in summary.read_text()


def test_merged_junit_stamps_each_suite_with_lane_and_environment(tmp_path):
    results = _results(tmp_path)
    merge(results, tmp_path / "merged.xml")
    suites = {s.name: {p.name: p.value for p in s.properties()} for s in JUnitXml.fromfile(str(tmp_path / "merged.xml"))}
    assert set(suites) == {"cpu", "sm90"}
    assert suites["sm90"]["lane"] == "sm90"
    assert {"gpu", "capability", "torch", "triton", "commit", "tolerance_overrides"} <= set(suites["cpu"])


def test_release_report_includes_benchmarks_and_their_blocking(tmp_path, capsys, monkeypatch):
    import selgate.bench.regression as regression

    class Cmp:
        blocking = ["sel decode B=8 / triton: baseline 0.1000 ms, latest 0.1500 ms (1.50x)"]

        def markdown(self):
            return "### Performance vs baseline: Fake GPU\n"

    seen = []
    monkeypatch.setattr(regression, "compare_to_baseline", lambda device: seen.append(device) or Cmp())
    write_lane(tmp_path / "res", "cpu", passing_cases())
    write_lane(tmp_path / "res", "sm90", passing_cases() + [("conformance/test_conformance.py::test_bf16", "pass", "dtype", 1)])
    (tmp_path / "res" / "sm90" / "environment.json").write_text(
        (tmp_path / "res" / "sm90" / "environment.json").read_text().replace('"gpu": "none"', '"gpu": "Fake GPU"')
    )
    rc = run_gate(tmp_path, command="release")
    assert seen == ["Fake GPU"]
    assert rc == 1
    assert capsys.readouterr().out.startswith("GATE BLOCKED: benchmark Fake GPU: sel decode B=8 / triton")
    text = (tmp_path / "out" / "release.md").read_text()
    assert text.startswith("# selgate release report") and "### Performance vs baseline: Fake GPU" in text


def test_release_without_gpu_lanes_blocks_and_says_no_benchmark_results(tmp_path, capsys):
    """`--lanes cpu` adds to the release profile's lanes: the missing sm90 lane blocks, and the
    benchmark section says why it has nothing to compare."""
    write_lane(tmp_path / "res", "cpu", passing_cases())
    rc = run_gate(tmp_path, "--lanes", "cpu", command="release")
    assert rc == 1 and "required lane sm90 missing" in capsys.readouterr().out
    assert "no benchmark results: no GPU lane in these results" in (tmp_path / "out" / "release.md").read_text()


def test_report_says_what_each_lane_never_ran(tmp_path):
    """The CPU lane's pass leaves the CUDA and Gluon kernels and bf16 on Triton to the GPU
    lanes: the report says so under the headline (the headline itself is unchanged). A skip
    for a declared lack of support is the implementation's, not a gap of the lane."""
    m = "conformance/test_parity.py::test_parity"
    cases = passing_cases() + [
        (f"{m}[triton-prefill-B2S9Skv33-G2h4-D16x8-n4-mixed-fp32-s0]", "pass", "parity", 0),
        (f"{m}[triton-prefill-B2S9Skv33-G2h4-D16x8-n4-mixed-bf16-s0]", "skip", "parity", 0),
        (f"{m}[sdpa-prefill-B2S9Skv33-G2h4-D16x8-n4-mixed-bf16-s0]", "pass", "parity", 0),
        (f"{m}[triton-pairs-prefill-B2S9Skv33-G2h4-D16x8-n4-mixed-fp16-s0]", "skip", "parity", 0),
        (f"{m}[cuda-decode-B2S1Skv37-G2h4-D16x16-n4-mixed-fp16-s0]", "skip", "parity", 0),
        (
            "conformance/test_gradcheck.py::test_gradcheck[triton-prefill-B1S3Skv9-G1h2-D8x8-n2-mixed-fp64-s0]",
            "skip",
            "gradcheck",
            0,
        ),
    ]
    write_lane(tmp_path / "res", "cpu", cases)
    results = load_results([tmp_path / "res"])
    lane = results["cpu"]
    gradcheck = next(c for c in lane.cases if c.family == "gradcheck" and "fp64" in c.nodeid)
    gradcheck.message = "triton does not declare fp64 (gradcheck runs in fp64)"
    assert lane_coverage(lane) == ["implementations triton-pairs, cuda", "bf16 on triton"]
    verdict = GateVerdict(required_lanes=["cpu"], coverage={"cpu": lane_coverage(lane)})
    text = render(results, verdict)
    assert text.splitlines()[2] == "**GATE PASSED: required lanes cpu**"
    assert "- cpu: never ran (every case skipped): implementations triton-pairs, cuda; bf16 on triton" in text


def test_the_report_says_why_tests_skipped(tmp_path):
    """Half a lane skipped: the report counts the skips and lists their most frequent reasons."""
    cases = passing_cases() + [(f"conformance/test_conformance.py::test_dtype[case{i}]", "skip", "dtype", 0) for i in range(12)]
    write_lane(tmp_path / "res", "cpu", cases)
    results = load_results([tmp_path / "res"])
    text = render(results, GateVerdict(required_lanes=["cpu"]))
    assert f"- cpu: 12 of {len(cases)} tests skipped" in text and "  - 12 x needs a GPU" in text, text
