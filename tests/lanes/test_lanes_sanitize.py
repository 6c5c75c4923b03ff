"""The compute-sanitizer pass on CPU: compute-sanitizer's output parsed from canned text, the
pass run end to end with a stand-in compute-sanitizer and driver, and the release gate that
blocks on findings, on a pass that is absent, incomplete or of another tree."""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from selgate.lanes import sanitize
from selgate.reports.__main__ import main as reports_main

from tests.reports.test_reports_gate import TREE, gated_tree, passing_cases, write_lane  # noqa: F401 (fixture)

MEMCHECK_FINDING = """\
========= COMPUTE-SANITIZER
gpu: NVIDIA H100 80GB HBM3
case triton_forward_prefill: ran
========= Invalid __global__ read of size 2 bytes
=========     at _sel_fwd_kernel+0x7f0 in /opt/selgate/kernels/triton/fwd.py:180
=========     by thread (32,0,0) in block (3,0,0)
=========     Address 0x7f3a2c000400 is out of bounds
=========
========= Invalid __global__ read of size 2 bytes
=========     at _sel_fwd_kernel+0x7f0 in /opt/selgate/kernels/triton/fwd.py:180
=========
========= ERROR SUMMARY: 2 errors
"""
RACECHECK_FINDING = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at _pair_kernel+0x1230 in pairs.py:150
=========     and Read access at _pair_kernel+0x1400 in pairs.py:160 [128 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""
CLEAN = "========= COMPUTE-SANITIZER\ncase cuda_decode_mma: ran\n========= ERROR SUMMARY: 0 errors\n"
RACECHECK_CLEAN = "========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"


@pytest.mark.parametrize(
    "tool, text, expected",
    [
        ("memcheck", MEMCHECK_FINDING, (2, 0, ["Invalid __global__ read of size 2 bytes"] * 2)),
        (
            "racecheck",
            RACECHECK_FINDING,
            (1, 0, ["Error: Race reported between Write access at _pair_kernel+0x1230 in pairs.py:150"]),
        ),
        ("initcheck", CLEAN, (0, 0, [])),
        ("racecheck", RACECHECK_CLEAN, (0, 0, [])),
        ("synccheck", "========= COMPUTE-SANITIZER\ncase triton_backward: ran\n", (None, 0, [])),  # cut off
    ],
)
def test_compute_sanitizer_output_is_parsed(tool, text, expected):
    assert sanitize.parse_output(tool, text) == expected


@pytest.mark.parametrize(
    "result, expected",
    [
        (
            sanitize.ToolResult("memcheck", 0, 12.0, 2, 0, ["Invalid __global__ read of size 2 bytes"]),
            "compute-sanitizer memcheck: 2 errors, e.g. Invalid __global__ read of size 2 bytes",
        ),
        (sanitize.ToolResult("racecheck", None, 150.0), "compute-sanitizer racecheck: timed out after 150 s"),
        (sanitize.ToolResult("synccheck", 1, 3.0), "compute-sanitizer synccheck: no error summary in its output (exit 1)"),
        (
            sanitize.ToolResult("initcheck", 1, 9.0, 0, tail="case gluon_prefill: FAILED RuntimeError: boom\n"),
            "compute-sanitizer initcheck: the cases failed under it (exit 1): case gluon_prefill: FAILED RuntimeError: boom",
        ),
        (sanitize.ToolResult("initcheck", 0, 9.0, 0), None),
    ],
)
def test_each_way_a_tool_run_blocks(result, expected):
    assert result.blocking() == expected or (expected and result.blocking().startswith(expected))


FAKE_SANITIZER = """#!{python}
import json, sys
outputs = json.load(open({outputs!r}))
print(outputs[sys.argv[sys.argv.index("--tool") + 1]], end="")
"""
FAKE_DRIVER = "import sys\nprint('gpu: Fake H100')\nprint('case ' + ' '.join(sys.argv[1:]) + ': ran')\n"


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """A compute-sanitizer printing canned output per tool, and a driver that runs nothing."""

    def make(outputs: dict):
        (tmp_path / "outputs.json").write_text(json.dumps(outputs))
        tool = tmp_path / "compute-sanitizer"
        tool.write_text(FAKE_SANITIZER.format(python=sys.executable, outputs=str(tmp_path / "outputs.json")))
        tool.chmod(0o755)
        return str(tool)

    (tmp_path / "fake_driver.py").write_text(FAKE_DRIVER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(sanitize, "DRIVER", "fake_driver")
    monkeypatch.setenv("SELGATE_CACHE_DIR", str(tmp_path / "cache"))
    # the pass stamps the gated tree of tests/reports/test_reports_gate.py
    monkeypatch.setattr("selgate.tree.tree_stamp", lambda root=None: dict(TREE))
    return make


def run_pass(tmp_path, sanitizer, tools=sanitize.TOOLS):
    return sanitize.run_pass(tools, ["gluon_prefill"], sanitizer=sanitizer, timeout_s=60, out_root=tmp_path / "res")


def release(tmp_path, capsys):
    capsys.readouterr()  # what the pass printed
    if not (tmp_path / "res" / "cpu").exists():
        write_lane(tmp_path / "res", "cpu", passing_cases())
    policy = tmp_path / "gate.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "default_profile": "merge",
                "required_families": ["parity"],
                "quarantine": [],
                "profiles": {"merge": {"required_lanes": ["cpu"]}, "release": {"required_lanes": ["cpu"], "sanitizer": True}},
            }
        )
    )
    rc = reports_main(["release", "--results", str(tmp_path / "res"), "--out", str(tmp_path / "out"), "--policy", str(policy)])
    report = (tmp_path / "out" / "release.md").read_text()
    return rc, capsys.readouterr().out.splitlines()[0], report


def test_a_clean_pass_writes_its_report_and_clears_the_release(tmp_path, capsys, stand_ins):
    sanitizer = stand_ins({"memcheck": CLEAN, "racecheck": RACECHECK_CLEAN, "initcheck": CLEAN, "synccheck": CLEAN})
    result = run_pass(tmp_path, sanitizer)
    assert result["blocking"] == [] and result["gpu"] == "Fake H100" and result["cases"] == ["gluon_prefill"]
    out = tmp_path / "res" / "sanitizer"
    assert "| racecheck | 0 | 0 |" in (out / "report.md").read_text()
    assert (out / "junit-sanitizer.xml").read_text().count("<testcase") == 4 and (out / "memcheck.log").exists()
    rc, headline, _ = release(tmp_path, capsys)
    assert (rc, headline) == (0, "GATE PASSED: required lanes cpu")


def test_findings_block_the_release_by_tool_even_if_the_file_says_otherwise(tmp_path, capsys, stand_ins):
    sanitizer = stand_ins({"memcheck": MEMCHECK_FINDING, "racecheck": RACECHECK_FINDING, "initcheck": CLEAN, "synccheck": CLEAN})
    result = run_pass(tmp_path, sanitizer)
    assert result["blocking"][0].startswith("compute-sanitizer memcheck: 2 errors")
    path = tmp_path / "res" / "sanitizer" / "result.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "blocking": []}))  # a hand-edited result
    rc, _, report = release(tmp_path, capsys)
    assert rc == 1
    assert "compute-sanitizer memcheck: 2 errors, e.g. Invalid __global__ read of size 2 bytes" in report
    assert "compute-sanitizer racecheck: 1 errors, e.g. Error: Race reported" in report


def test_a_missing_incomplete_or_foreign_pass_blocks_the_release(tmp_path, capsys, stand_ins):
    rc, _, report = release(tmp_path, capsys)
    assert rc == 1 and "the compute-sanitizer pass is missing: no sanitizer/result.json" in report
    sanitizer = stand_ins({"memcheck": CLEAN})
    run_pass(tmp_path, sanitizer, tools=["memcheck"])
    path = tmp_path / "res" / "sanitizer" / "result.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "tree": {**TREE, "commit": "5" * 40}}))
    rc, _, report = release(tmp_path, capsys)
    assert rc == 1
    assert "the compute-sanitizer pass did not run ['racecheck', 'initcheck', 'synccheck']" in report
    assert f"the compute-sanitizer pass ran commit '{'5' * 40}'" in report


def test_the_shipped_release_profile_requires_the_pass():
    policy = yaml.safe_load((sanitize.ROOT / "reports" / "gate.yaml").read_text())
    assert policy["profiles"]["release"]["sanitizer"] is True
