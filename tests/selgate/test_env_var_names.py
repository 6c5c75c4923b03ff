"""Variable names: one scheme (`SELGATE_<part>_<what>`), and selgate reads its own namespace only.

Another project's variables, such as nsa-vibe's `NSA_*` flags set by a user validating it, change
nothing in selgate: its settings keep their defaults, nothing is logged, and processes selgate
starts get them exactly as the caller set them, next to selgate's own."""

from __future__ import annotations

import logging
import re
import subprocess

import pytest

from selgate import env_vars
from selgate.kernels import policy
from selgate.kernels.policy import ENV_FLAGS

# nsa-vibe's own flags (its Triton selection on, its min-L threshold 1, its CUDA path, a
# capability), as a user validating nsa-vibe has them set.
NSA_VIBE = {
    "NSA_USE_TRITON_SEL": "1",
    "NSA_SEL_TRITON_MIN_L": "1",
    "NSA_TRITON_SEL_FORCE": "1",
    "NSA_FORCE_PARITY": "1",
    "NSA_SEL_STRICT": "1",
    "NSA_SEL_CUDA": "1",
    "NSA_SEL_CAPABILITY": "8.9",
    "NSA_DEBUG_LOG": "1",
    "NSA_SEL_TRITON_FWD_CONFIG": "BLOCK_L=16",
    "NSA_SEL_CUDA_CACHE": "/elsewhere",
}


@pytest.fixture
def nsa_vibe(monkeypatch, caplog):
    """The process environment of someone validating nsa-vibe, selgate's own variables unset,
    with the `selgate` logger captured."""
    for name in env_vars.VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in NSA_VIBE.items():
        monkeypatch.setenv(name, value)
    caplog.set_level(logging.DEBUG, logger="selgate")
    return caplog


def test_every_variable_follows_the_scheme():
    assert [name for name in env_vars.VARS if not re.fullmatch(r"SELGATE_[A-Z0-9]+(_[A-Z0-9]+)*", name)] == []


def test_another_projects_flags_leave_selgates_settings_at_their_defaults(nsa_vibe):
    """NSA_USE_TRITON_SEL=1 and NSA_SEL_TRITON_MIN_L=1 are nsa-vibe's: selgate's dispatcher reads
    what it reads without them, and no warning (or any line) is logged."""
    for name, var in env_vars.VARS.items():
        assert env_vars.get(name) == var.default, name
    assert policy.capability_overridden() is None
    assert [r.getMessage() for r in nsa_vibe.records if r.name.startswith("selgate")] == []


def test_the_dispatch_policy_is_that_of_a_clean_environment(nsa_vibe, monkeypatch):
    with_them = policy.dispatch_policy()
    for name in NSA_VIBE:
        monkeypatch.delenv(name)
    assert with_them == policy.dispatch_policy()
    assert nsa_vibe.records == []


def test_the_tests_clear_only_selgates_dispatcher_flags():
    assert set(ENV_FLAGS) == {name for name, var in env_vars.VARS.items() if var.group == "dispatcher"}


def test_another_projects_names_are_no_registry_keys():
    with pytest.raises(KeyError, match=r"^'NSA_USE_TRITON_SEL is not in selgate.env_vars.VARS; declare it there'$"):
        env_vars.get("NSA_USE_TRITON_SEL")


# --- handing the environment on ---------------------------------------------------------


def test_a_lane_worker_gets_the_lanes_values_and_another_projects_flags_untouched(nsa_vibe):
    from selgate.lanes.runner import run_env

    env = run_env({"SELGATE_TRITON_FORCE": "0"})
    assert env["SELGATE_TRITON_FORCE"] == "0" and "SELGATE_TRITON_ENABLE" not in env
    assert env["NSA_USE_TRITON_SEL"] == "1" and "SELGATE_TRITON_MIN_L" not in env


def test_a_lane_plan_ignores_another_projects_cuda_build_and_cache(nsa_vibe, monkeypatch):
    from selgate.lanes.config import load_lane
    from selgate.lanes.runner import cache_root, plan_lane

    monkeypatch.setenv("NSA_SEL_CUDA_BUILD", "0")
    plan = plan_lane(load_lane("sm89"), capability="9.0", gpus=1, emulate=True)
    assert plan.env["SELGATE_CUDA_BUILD"] == "1"
    assert plan.env["SELGATE_CUDA_CACHE"] == str(cache_root() / "cuda")


def test_a_policy_probe_gets_the_checks_capability(nsa_vibe, monkeypatch):
    from selgate.lanes import policy as lane_policy

    seen = {}

    def fake_run(cmd, env, **kw):
        seen.update(env)
        return subprocess.CompletedProcess(cmd, 0, stdout='{"calls": {}}\n', stderr="")

    monkeypatch.setattr(lane_policy.subprocess, "run", fake_run)
    lane_policy.probe_in_subprocess({"SELGATE_CAPABILITY": "9.0"})
    assert seen["SELGATE_CAPABILITY"] == "9.0" and seen["NSA_SEL_CAPABILITY"] == "8.9"


def test_the_stamp_records_no_capability_override_from_another_project(nsa_vibe):
    from selgate.environment import collect_environment

    assert collect_environment()["capability_override"] == "none"
