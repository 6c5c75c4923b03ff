"""Policy files read strictly: each case here once ended GATE PASSED (or in a traceback) where
the gate must block or refuse the policy (exit 2, naming the file and the line).

- a quarantine pattern covers its implementation only, named whole;
- an unknown or repeated key, in reports/gate.yaml or a lane YAML, is an error, and so is a
  policy that requires no family;
- a tolerance override is tied to what was measured, and its numbers parse in any YAML
  spelling, through the environment variable the lane runner sets, to the bound a test uses;
- a results file or a date of another shape than expected is a named error, not a traceback."""

import datetime
import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from selgate.conformance import tolerances
from selgate.lanes.config import LANE_DIR, MAX_OVERRIDE_MARGIN, TOL_ENV, load_lane, tolerance_env
from selgate.reports.gate import IMPLEMENTATIONS, implementation_of, load_policy

from tests.reports.test_reports_gate import (
    REQUIRED,
    TODAY,
    gated_tree,  # noqa: F401 (fixture)
    passing_cases,
    run_gate,
    write_lane,
    write_policy,
)

ROOT = Path(__file__).resolve().parents[2]
PARITY = "conformance/test_conformance.py::test_parity"


def gate(tmp_path, capsys, *extra, policy=None):
    """(exit status, stdout's first line, stderr)."""
    rc = run_gate(tmp_path, *extra, policy=policy)
    out = capsys.readouterr()
    return rc, (out.out.splitlines() or [""])[0], out.err


def policy_text(tmp_path, text):
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    return path


def line_of(path, needle):
    """The 1-based line of `path` holding `needle` (the last one: a repeat is what is named)."""
    return [i for i, line in enumerate(Path(path).read_text().splitlines(), 1) if needle in line][-1]


# Quarantine patterns name one implementation, whole ----------------------------------------


def _entry(test, **change):
    return {
        "test": test,
        "owner": "kernels-team",
        "reason": "fp32 drift on the interpreter, #12",
        "expires": TODAY + datetime.timedelta(days=7),
        "lanes": ["cpu"],
        **change,
    }


@pytest.mark.parametrize("kernel", ["triton-gather", "triton-tma", "triton-pairs"])
def test_a_triton_pattern_does_not_quarantine_another_triton_kernel(tmp_path, capsys, kernel):
    """`test_parity[triton-*]` once covered triton-gather's and triton-tma's failures too."""
    failing = f"{PARITY}[{kernel}-prefill-B1S4Skv21-fp32-s0]"
    write_lane(tmp_path / "res", "cpu", passing_cases() + [(failing, "fail", "parity", 0)])
    rc, line, _ = gate(tmp_path, capsys, policy=write_policy(tmp_path, [_entry(f"{PARITY}[triton-*]")]))
    assert rc == 1 and line.startswith(f"GATE BLOCKED: lane cpu: FAIL {failing}"), line


def test_a_triton_pattern_still_quarantines_triton_and_a_gather_pattern_its_own(tmp_path, capsys):
    cases = [(f"{PARITY}[triton-prefill-B1S4Skv21-fp32-s0]", "fail", "parity", 0)]
    cases += [(f"{PARITY}[triton-gather-decode-B2S1Skv9-fp16-s1]", "fail", "parity", 1)]
    write_lane(tmp_path / "res", "cpu", passing_cases() + cases)
    entries = [_entry(f"{PARITY}[triton-*]"), _entry(f"{PARITY}[triton-gather-*fp16*]")]
    rc, line, _ = gate(tmp_path, capsys, policy=write_policy(tmp_path, entries))
    assert (rc, line) == (0, "GATE PASSED: required lanes cpu")


def test_the_gate_knows_every_registered_implementation():
    """The gate reads implementations from test ids without importing the registry (which
    imports the kernels): its list must be the registry's."""
    from selgate.conformance.registry import REGISTRY

    assert set(IMPLEMENTATIONS) == set(REGISTRY)
    assert implementation_of(f"{PARITY}[triton-tma-prefill-x]") == "triton-tma"
    assert implementation_of(f"{PARITY}[triton-*]") == "triton"
    assert implementation_of(f"{PARITY}[pkg.mod:fn-prefill-x]") == "pkg.mod:fn"


# Unknown and repeated keys, empty required families ----------------------------------------

RELEASE_POLICY = textwrap.dedent(
    """\
    default_profile: merge
    profiles:
      merge:
        required_lanes: [cpu]
      release:
        required_lanes: [cpu, sm90]
        {flags}
    required_families: [parity, bounds, policy]
    quarantine: []
    """
)


def _release_lanes(tmp_path):
    cases = passing_cases() + passing_cases(["dtype"])
    for lane in ("cpu", "sm90"):
        write_lane(tmp_path / "res", lane, cases)


@pytest.mark.parametrize("flags", ["sanitiser: true", "same_comit: true", "sanitizer: true\n    santizer: false"])
def test_a_misspelt_profile_flag_is_a_policy_error_not_a_release_without_it(tmp_path, capsys, flags):
    """`sanitiser: true` was ignored: the release passed with no sanitizer pass, and
    `same_comit: true` with no clean-tree check."""
    _release_lanes(tmp_path)
    path = policy_text(tmp_path, RELEASE_POLICY.format(flags=flags))
    typo = flags.splitlines()[-1].split(":")[0].strip()
    rc, _, err = gate(tmp_path, capsys, "--profile", "release", policy=path)
    assert rc == 2, err
    assert f"{path}:{line_of(path, typo)}: profiles.release.{typo}: unknown key" in err, err
    assert "Traceback" not in err


def test_an_unknown_top_level_key_is_a_policy_error(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    path = write_policy(tmp_path)
    path.write_text(path.read_text() + "quarantined:\n- test: x\n")
    rc, _, err = gate(tmp_path, capsys, policy=path)
    assert rc == 2 and f"{path}:{line_of(path, 'quarantined')}: quarantined: unknown key" in err, err


def test_a_second_profiles_key_is_a_policy_error_not_a_silent_replacement(tmp_path, capsys):
    """A second `profiles:` replaced the first: here its release needs neither sanitizer nor
    the sm90 lane."""
    write_lane(tmp_path / "res", "cpu", passing_cases())
    path = policy_text(
        tmp_path,
        RELEASE_POLICY.format(flags="sanitizer: true")
        + "profiles:\n  merge: {required_lanes: [cpu]}\n  release: {required_lanes: [cpu]}\n",
    )
    rc, _, err = gate(tmp_path, capsys, "--profile", "release", policy=path)
    assert rc == 2, err
    assert f"{path}:{line_of(path, 'profiles:')}: duplicate key 'profiles' (first on line 2)" in err, err


def test_a_repeated_key_inside_a_quarantine_entry_is_a_policy_error(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    path = write_policy(tmp_path, [_entry(f"{PARITY}[triton-*]")])
    text = path.read_text().replace("  lanes:\n", "  lanes: [sm90]\n  lanes:\n", 1)
    path.write_text(text)
    rc, _, err = gate(tmp_path, capsys, policy=path)
    assert rc == 2 and f"{path}:{line_of(path, 'lanes:')}: duplicate key 'lanes'" in err, err


@pytest.mark.parametrize("families", ["[]", "[parrity]", "[parity, 3]", "parity", "null"])
def test_required_families_must_name_known_families(tmp_path, capsys, families):
    """`required_families: []` was accepted: a lane that ran no family at all passed."""
    write_lane(tmp_path / "res", "cpu", passing_cases())
    path = policy_text(tmp_path, RELEASE_POLICY.format(flags="").replace("[parity, bounds, policy]", families))
    rc, _, err = gate(tmp_path, capsys, policy=path)
    assert rc == 2, err
    assert f"{path}:{line_of(path, 'required_families')}: required_families: expected a non-empty list" in err, err


def test_the_shipped_policy_still_loads():
    policy = load_policy()
    assert set(policy["required_families"]) >= set(REQUIRED) and policy["profiles"]["release"]["sanitizer"] is True


# Lane YAML: unknown and repeated keys ------------------------------------------------------


def lane_text(tmp_path, old, new, base="sm90"):
    """lanes/<base>.yaml with `old` replaced by `new`, as lane `x` in tmp_path."""
    text = (LANE_DIR / f"{base}.yaml").read_text()
    assert old in text
    (tmp_path / "x.yaml").write_text(text.replace(old, new, 1))
    return tmp_path / "x.yaml"


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("timeout: 120", "timeout: 120\ntimeuot: 30", "timeuot: unknown key"),
        ("timeout: 120", "timeout: 120\ntimeout: 99999", "duplicate key 'timeout' (first on line"),
        ("  base_image:", "  base_imag: x\n  base_image:", "image.base_imag: unknown key"),
        ("    triton_launches: true", "    triton_launches: true\n    triton_launches: false  # the second", "duplicate key"),
    ],
)
def test_an_unknown_or_repeated_key_in_a_lane_yaml_is_an_error(tmp_path, old, new, expected):
    path = lane_text(tmp_path, old, new)
    added = (set(new.splitlines()) - set(old.splitlines())).pop()
    with pytest.raises(ValueError, match=re.escape(f"{path}:{line_of(path, added)}: ") + ".*" + re.escape(expected)):
        load_lane("x", tmp_path)


# Tolerance overrides tied to measurements --------------------------------------------------


def override_lane(tmp_path, overrides: str):
    """The sm90 lane with `tolerance_overrides` set to `overrides` (YAML text, as written)."""
    return lane_text(tmp_path, "tolerance_overrides: {}", f"tolerance_overrides: {overrides}")


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ("{fp32: {max_abs: 1000, reason: r, measured: {}}}", "fp32.measured: no measured error for max_abs"),
        ("{fp32: {max_abs: 10, reason: r, measured: {max_abs: 1.0e-5}}}", f"more than {MAX_OVERRIDE_MARGIN}x the measured"),
        ("{fp16: {dk: {factor: 40}, reason: r, measured: {factor: 3}}}", "fp16.measured.factor: unknown key"),
        ("{fp16: {dk: {factor: 40}, reason: r, measured: {dk: {factor: 3}}}}", "fp16.dk.factor: 40 is more than"),
        ("{fp16: {factor: 3, mean_abs: 1, reason: r, measured: {factor: 2.6}}}", "no measured error for mean_abs"),
        ("{fp16: {factor: 3, reason: r, measured: 2.6}}", "fp16.measured: expected the measured error per field"),
        ("{fp16: {reason: r, measured: {}}}", "tolerance_overrides.fp16: sets no bound"),
        ("{fp32: {max_abs: 2.0e-5, reason: r, measured: {max_abs: '1.6e-5'}}}", "expected a finite number >= 0, got '1.6e-5'"),
    ],
)
def test_an_override_not_backed_by_its_measurement_is_an_error(tmp_path, overrides, expected):
    """`measured: {}` beside `max_abs: 1000`, or 1e-5 measured beside a bound of 10, loaded."""
    path = override_lane(tmp_path, overrides)
    line = line_of(path, "tolerance_overrides")
    with pytest.raises(ValueError, match=re.escape(f"{path}:{line}: ") + ".*" + re.escape(expected)):
        load_lane("x", tmp_path)


def test_the_margin_is_documented_where_overrides_are():
    section = (ROOT / "docs" / "gate.md").read_text().split("## Tolerances", 1)[1].split("\n## ", 1)[0]
    assert "MAX_OVERRIDE_MARGIN" in section and f"{MAX_OVERRIDE_MARGIN}x" in section


@pytest.mark.parametrize(
    "spelling, value",
    [("2.0e-5", 2.0e-5), ("2e-05", 2e-05), ("2E-5", 2e-05), ("0.00002", 2e-05), ("1e-3", 1e-3), ("1E-3", 1e-3), (".5e-3", 5e-4)],
)
def test_the_documented_override_reaches_the_bound_a_test_uses(tmp_path, monkeypatch, spelling, value):
    """`max_abs: 2.0e-5` (docs and conformance/tolerances.py) was rejected: written as JSON
    (`2e-05`) and read back as YAML 1.1, where that is a string. Every spelling of a number
    goes lane YAML -> SELGATE_TOL_OVERRIDES -> tolerance() unchanged."""
    override_lane(
        tmp_path, f"{{fp32: {{max_abs: {spelling}, reason: 'H100 fp32 drift, #12', measured: {{max_abs: {spelling}}}}}}}"
    )
    lane = load_lane("x", tmp_path)
    env = tolerance_env(lane)
    assert json.loads(env[TOL_ENV]) == {"fp32": {"max_abs": value}}
    assert yaml.safe_load(env[TOL_ENV]) == {"fp32": {"max_abs": value}}  # as parse_overrides reads it
    monkeypatch.setenv(TOL_ENV, env[TOL_ENV])
    tol = tolerances.tolerance(torch.float32, "o")
    assert tol.max_abs == value and tol.source.startswith(TOL_ENV)


def test_a_tensor_override_reaches_its_tensor_only(tmp_path, monkeypatch):
    override_lane(tmp_path, "{fp16: {dk: {factor: 4e0}, reason: 'dk, #12', measured: {dk: {factor: 3.1}}}}")
    monkeypatch.setenv(TOL_ENV, tolerance_env(load_lane("x", tmp_path))[TOL_ENV])
    assert tolerances.tolerance(torch.float16, "dk").factor == 4.0
    assert tolerances.tolerance(torch.float16, "dq").factor == 3.0  # SPEC.md's


@pytest.mark.parametrize("spelling", ["'2e-05'", ".nan", ".inf", "-.inf", "true", "abc", "[1]", "-1e-5"])
def test_a_bound_that_is_not_a_finite_number_is_an_error(tmp_path, spelling):
    override_lane(tmp_path, f"{{fp32: {{max_abs: {spelling}, reason: r, measured: {{max_abs: 1.0e-5}}}}}}")
    with pytest.raises(ValueError, match=r"tolerance_overrides: .*fp32\.max_abs: expected a finite number >= 0"):
        load_lane("x", tmp_path)


# Files of another shape: named errors, not tracebacks --------------------------------------


@pytest.mark.parametrize("content", ["[]", "3", "null", '"cpu"'])
def test_an_environment_json_that_is_not_an_object_is_a_named_error(tmp_path, capsys, content):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    path = tmp_path / "res" / "cpu" / "environment.json"
    path.write_text(content)
    rc, _, err = gate(tmp_path, capsys)
    assert rc == 2 and f"{path}: expected a JSON object" in err, err
    assert "Traceback" not in err


def test_an_inventory_json_that_is_not_an_object_is_a_named_error(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    path = tmp_path / "res" / "cpu" / "inventory.json"
    path.write_text("[]")
    rc, _, err = gate(tmp_path, capsys)
    assert rc == 2 and f"{path}: expected a JSON object" in err, err


@pytest.mark.parametrize("expires", ["2026-12-08 00:00:00", "2026-12-08T10:00:00Z", "20261208", "'2026-12-8'", "soon"])
def test_an_expiry_that_is_not_a_date_is_a_named_error(tmp_path, capsys, expires):
    """`expires: 2026-12-08 00:00:00` (YAML reads a datetime) once ended in a traceback (exit 1)."""
    write_lane(tmp_path / "res", "cpu", passing_cases())
    path = write_policy(tmp_path, [_entry(f"{PARITY}[triton-*]")])
    path.write_text(re.sub(r"expires: \S+", f"expires: {expires}", path.read_text()))
    rc, _, err = gate(tmp_path, capsys, policy=path)
    assert rc == 2, err
    assert f"{path}:{line_of(path, 'expires')}: quarantine[0]" in err and "expires: expected a date YYYY-MM-DD" in err, err
    assert "Traceback" not in err


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys):
    write_lane(tmp_path / "res", "cpu", passing_cases())
    path = write_policy(tmp_path)
    path.write_text(path.read_text() + "quarantine: [\n")
    rc, _, err = gate(tmp_path, capsys, policy=path)
    assert rc == 2 and re.search(rf"{re.escape(str(path))}:\d+: ", err), err
