"""Variable names: one scheme (`SELGATE_<part>_<what>`), former names still read (one warning
per process and name, the current name winning, a disagreement an error naming both), every
former name mapped onto a registered variable, handed to child processes under the current
name, and mentioned nowhere in the product but the registry.

The tests take former names from the registry rather than spelling them, so this file is no
exception to the last rule."""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
from pathlib import Path

import pytest

from selgate.kernels import settings
from selgate.kernels.errors import ConfigError
from selgate.kernels.policy import ENV_FLAGS

ROOT = Path(__file__).resolve().parents[1]

# The registry, the page generated from it, and the changelog that records the renames.
REGISTRY_FILES = frozenset({"kernels/settings.py", "docs/configuration.md", "CHANGELOG.md"})
# Results recorded by an earlier run (test ids included), replaced by the next run, not edited.
RECORDS = ("reports/evidence/",)


def former(name: str) -> str:
    """The (first) former name of variable `name`."""
    return settings.VARS[name].deprecated[0]


@pytest.fixture
def fresh_warnings(monkeypatch, caplog):
    """A process that has warned about no former name yet, with the `selgate` logger captured."""
    monkeypatch.setattr(settings, "_WARNED", set())
    caplog.set_level(logging.WARNING, logger="selgate")
    return caplog


def deprecation_lines(caplog, old: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "selgate" and r.levelno == logging.WARNING and old in r.getMessage()
    ]


# --- the scheme and the mapping -------------------------------------------------------


def test_every_variable_follows_the_scheme():
    assert [name for name in settings.VARS if not re.fullmatch(r"SELGATE_[A-Z0-9]+(_[A-Z0-9]+)*", name)] == []


def test_every_former_name_maps_to_one_registered_variable():
    pairs = [(old, var.name) for var in settings.VARS.values() for old in var.deprecated]
    assert pairs, "the registry records the renames"
    olds = [old for old, _ in pairs]
    assert len(olds) == len(set(olds)), "a former name belongs to one variable"
    assert settings.DEPRECATED == dict(pairs)
    assert not set(olds) & set(settings.VARS), "a former name is not a current one"
    for old, new in pairs:
        assert new in settings.VARS and old in settings.VARS[new].names
        assert old != new and not old.startswith("SELGATE_")


def test_the_generated_page_lists_the_former_names():
    page = settings.markdown()
    for old, new in settings.DEPRECATED.items():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{new}` |"))
        assert row.split(" | ")[-1].rstrip(" |").split(", ").count(f"`{old}`") == 1, row


# --- reading ----------------------------------------------------------------------------


def test_a_former_name_is_read_with_one_warning_per_process(fresh_warnings, monkeypatch):
    old = former("SELGATE_STRICT")
    monkeypatch.delenv("SELGATE_STRICT", raising=False)
    monkeypatch.setenv(old, "1")
    assert settings.get("SELGATE_STRICT") is True
    assert settings.get("SELGATE_STRICT") is True
    assert settings.get("SELGATE_STRICT", environ={old: "yes"}) is True
    lines = deprecation_lines(fresh_warnings, old)
    assert len(lines) == 1, lines
    assert "deprecated" in lines[0] and "SELGATE_STRICT" in lines[0]
    assert settings.source("SELGATE_STRICT") == old


def test_the_current_name_alone_warns_about_nothing(fresh_warnings):
    assert settings.get("SELGATE_TRITON_MIN_L", environ={"SELGATE_TRITON_MIN_L": "64"}) == 64
    assert fresh_warnings.records == []


def test_the_current_name_wins(fresh_warnings):
    old = former("SELGATE_TRITON_MIN_L")
    env = {"SELGATE_TRITON_MIN_L": "64", old: ""}  # empty counts as unset
    assert settings.get("SELGATE_TRITON_MIN_L", environ=env) == 64
    assert settings.source("SELGATE_TRITON_MIN_L", environ=env) == "SELGATE_TRITON_MIN_L"
    same = {"SELGATE_STRICT": "1", former("SELGATE_STRICT"): "yes"}  # the same value, spelt differently
    assert settings.get("SELGATE_STRICT", environ=same) is True
    assert settings.source("SELGATE_STRICT", environ=same) == "SELGATE_STRICT"
    assert len(deprecation_lines(fresh_warnings, former("SELGATE_STRICT"))) == 1  # still set: still said


@pytest.mark.parametrize(
    "name, new, old", [("SELGATE_STRICT", "1", "0"), ("SELGATE_TRITON_MIN_L", "64", "128"), ("SELGATE_CAPABILITY", "8.9", "9.0")]
)
def test_two_names_set_to_different_values_raise_naming_both(name, new, old):
    env = {name: new, former(name): old}
    with pytest.raises(ConfigError, match=rf"{name} and {former(name)} are both set"):
        settings.get(name, environ=env)
    with pytest.raises(ConfigError, match=former(name)):
        settings.current_environ(env)


def test_the_process_environment_conflict_is_refused(monkeypatch):
    monkeypatch.setenv("SELGATE_CAPABILITY", "8.9")
    monkeypatch.setenv(former("SELGATE_CAPABILITY"), "8.0")
    with pytest.raises(ConfigError, match=rf"SELGATE_CAPABILITY and {former('SELGATE_CAPABILITY')}"):
        settings.get("SELGATE_CAPABILITY")


@pytest.mark.parametrize(
    "name, raw, expected",
    [
        ("SELGATE_STRICT", "maybe", "expected one of"),
        ("SELGATE_TRITON_MIN_L", "4k", "expected an integer"),
        ("SELGATE_CUDA_BUILD_WAIT", "soon", "expected a finite number"),
    ],
)
def test_a_malformed_former_value_names_the_variable_actually_set(name, raw, expected):
    old = former(name)
    with pytest.raises(ConfigError, match=rf"^{old}: {expected}.*{raw!r}"):
        settings.get(name, environ={old: raw})
    with pytest.raises(ConfigError, match=rf"^{old}: {expected}"):  # beside a valid current value too
        settings.get(name, environ={name: "1", old: raw})


def test_a_former_name_is_no_registry_key():
    with pytest.raises(KeyError, match="renamed SELGATE_STRICT"):
        settings.get(former("SELGATE_STRICT"))


# --- handing the environment on ---------------------------------------------------------


def test_children_get_current_names_only():
    old = former("SELGATE_CAPABILITY")
    env = settings.current_environ({old: "8.9", "PATH": "/bin", "SELGATE_LANE": "cpu"})
    assert env == {"SELGATE_CAPABILITY": "8.9", "PATH": "/bin", "SELGATE_LANE": "cpu"}


def test_the_dispatcher_flags_tests_clear_include_the_former_names():
    for var in settings.VARS.values():
        if var.group == "dispatcher":
            assert set(var.names) <= set(ENV_FLAGS), var.name


def test_a_lane_worker_sees_the_lanes_value_not_a_former_name_from_outside(monkeypatch):
    from selgate.lanes.runner import run_env

    old = former("SELGATE_TRITON_FORCE")
    monkeypatch.delenv("SELGATE_TRITON_FORCE", raising=False)
    monkeypatch.setenv(old, "1")
    env = run_env({"SELGATE_TRITON_FORCE": "0"})
    assert env["SELGATE_TRITON_FORCE"] == "0" and old not in env
    assert run_env({})["SELGATE_TRITON_FORCE"] == "1"


def test_the_callers_cuda_build_setting_under_a_former_name_still_wins(monkeypatch):
    from selgate.lanes.config import load_lane
    from selgate.lanes.runner import plan_lane, run_env

    monkeypatch.delenv("SELGATE_CUDA_BUILD", raising=False)
    monkeypatch.setenv(former("SELGATE_CUDA_BUILD"), "0")
    plan = plan_lane(load_lane("sm89"), capability="9.0", gpus=1, emulate=True)
    assert "SELGATE_CUDA_BUILD" not in plan.env
    assert run_env(plan.env)["SELGATE_CUDA_BUILD"] == "0"


def test_a_policy_probe_gets_the_checks_env_over_a_former_name(monkeypatch):
    from selgate.lanes import policy

    seen = {}

    def fake_run(cmd, env, **kw):
        seen.update(env)
        return subprocess.CompletedProcess(cmd, 0, stdout='{"calls": {}}\n', stderr="")

    old = former("SELGATE_CAPABILITY")
    monkeypatch.delenv("SELGATE_CAPABILITY", raising=False)
    monkeypatch.setenv(old, "9.0")
    monkeypatch.setattr(policy.subprocess, "run", fake_run)
    policy.probe_in_subprocess({"SELGATE_CAPABILITY": "8.9"})
    assert seen["SELGATE_CAPABILITY"] == "8.9" and old not in seen


def test_a_container_gets_current_names_only():
    from selgate.lanes.docker_backend import container_env

    old = former("SELGATE_CAPABILITY")
    env = container_env({old: "8.9", "SELGATE_COMMIT": "0" * 40})
    assert env["SELGATE_CAPABILITY"] == "8.9" and old not in env


def test_the_stamp_records_a_capability_override_set_under_its_former_name(monkeypatch):
    from selgate.reports.environment import collect_environment

    monkeypatch.delenv("SELGATE_CAPABILITY", raising=False)
    monkeypatch.setenv(former("SELGATE_CAPABILITY"), "8.9")
    assert collect_environment()["capability_override"] == "8.9"


def test_a_tolerance_override_under_a_former_name_is_refused_and_stamped_as_the_current_one(monkeypatch):
    """The runner's refusal and the gate's stamp read the variable through the registry, so a
    former name is seen exactly as the current one (here a former name given to the variable
    for the test)."""
    from selgate.conformance.tolerances import ENV as TOL_ENV
    from selgate.lanes.config import load_lane
    from selgate.lanes.runner import plan_lane
    from selgate.reports.environment import collect_environment
    from selgate.reports.gate import tolerances

    old = "SELGATE_TEST_FORMER_TOL_OVERRIDES"
    monkeypatch.setitem(settings.VARS, TOL_ENV, dataclasses.replace(settings.VARS[TOL_ENV], deprecated=(old,)))
    monkeypatch.setitem(settings.DEPRECATED, old, TOL_ENV)
    monkeypatch.setattr(settings, "_WARNED", set())
    monkeypatch.delenv(TOL_ENV, raising=False)
    loose = '{"float32": {"o": {"max_abs": 1.0}}}'
    monkeypatch.setenv(old, loose)
    with pytest.raises(ValueError, match=rf"^{old}: set in the environment"):
        plan_lane(load_lane("cpu"), capability=None)
    stamped = collect_environment()["tolerance_overrides"]
    assert stamped == loose
    assert tolerances("cpu", {"tolerance_overrides": stamped}, load_lane("cpu")) != []
    assert settings.current_environ()[TOL_ENV] == loose


# --- no former name in the product --------------------------------------------------------


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [f for f in out.stdout.split("\0") if f]


def test_no_product_file_names_a_variable_by_a_former_name():
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(settings.DEPRECATED, key=len, reverse=True))) + r")\b")
    found = {}
    for rel in tracked_files():
        if rel in REGISTRY_FILES or rel.startswith(RECORDS):
            continue
        path = ROOT / rel
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for old in pattern.findall(line):
                found.setdefault(rel, []).append(f"{number}: {old} -> {settings.DEPRECATED[old]}")
    assert found == {}, "rename these to the current names (kernels/settings.py): " + repr(found)
