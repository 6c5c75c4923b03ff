"""Lane YAMLs, GPU-class detection and the lane runner's command line (no pytest is run)."""

import json
import re

import pytest
import yaml

from selgate.lanes.config import TOL_ENV, lane_names, load_lane, tolerance_env
from selgate.lanes.detect import lane_for
from selgate.lanes.runner import plan_lane


def test_every_lane_yaml_loads_and_declares_a_policy():
    assert {"cpu", "sm80", "sm89", "sm90"} <= set(lane_names())
    for name in lane_names():
        lane = load_lane(name)
        assert lane["policy"], f"lane {name} shows no policy"


def test_sm89_lane_asserts_the_adr_both_ways():
    checks = {c["triton_launches"]: c["env"] for c in load_lane("sm89")["policy"]}
    assert checks[False] == {"SELGATE_CAPABILITY": "8.9"}
    assert checks[True] == {"SELGATE_CAPABILITY": "8.9", "SELGATE_TRITON_FORCE": "1"}


@pytest.mark.parametrize("cap,lane", [(None, "cpu"), ("9.0", "sm90"), ("8.9", "sm89"), ("8.0", "sm80"), ("8.6", "sm80")])
def test_detection_maps_capability_to_lane(cap, lane):
    assert lane_for(cap) == lane


def test_detection_names_an_unknown_capability():
    with pytest.raises(ValueError, match="compute capability 10.0 matches lanes"):
        lane_for("10.0")


def _write_lane(tmp_path, **changes):
    lane = {k: v for k, v in load_lane("sm90").items() if k != "name"}
    lane.update(changes)
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(lane))
    return tmp_path


def test_tolerance_override_needs_a_reason(tmp_path):
    _write_lane(tmp_path, tolerance_overrides={"fp16": {"factor": 3}})
    with pytest.raises(ValueError, match=r"tolerance_overrides.fp16: every override needs a 'reason'"):
        load_lane("x", tmp_path)


def test_tolerance_overrides_reach_the_env_without_reasons(tmp_path):
    _write_lane(tmp_path, tolerance_overrides={"fp16": {"factor": 3, "reason": "2.6x on L4", "measured": {"factor": 2.6}}})
    env = tolerance_env(load_lane("x", tmp_path))
    assert json.loads(env[TOL_ENV]) == {"fp16": {"factor": 3}}


@pytest.mark.parametrize(
    "override, where",
    [
        ({"factor": 3, "reason": "2.6x on L4"}, "every override needs a 'reason' and 'measured'"),
        ({"factor": 3, "reason": "2.6x on L4", "measured": float("nan")}, "measured: expected a finite number >= 0"),
        ({"factor": float("nan"), "reason": "r", "measured": 2.6}, "fp16.factor: expected a finite number >= 0"),
        ({"max_abs": -1.0, "reason": "r", "measured": 2.6}, "fp16.max_abs: expected a finite number >= 0"),
        ({"o": {"mean_abs": float("inf")}, "reason": "r", "measured": 2.6}, "fp16.o.mean_abs: expected a finite"),
    ],
)
def test_a_tolerance_override_without_measurement_or_with_a_bad_bound_is_rejected(tmp_path, override, where):
    _write_lane(tmp_path, tolerance_overrides={"fp16": override})
    with pytest.raises(ValueError, match=re.escape(where)):
        load_lane("x", tmp_path)


def test_unknown_family_and_bad_workers_are_rejected(tmp_path):
    _write_lane(tmp_path, required_families=["parity", "parrity"])
    with pytest.raises(ValueError, match=r"required_families: unknown \['parrity'\]"):
        load_lane("x", tmp_path)
    _write_lane(tmp_path, workers=0)
    with pytest.raises(ValueError, match="workers: expected an integer >= 1"):
        load_lane("x", tmp_path)


def test_cpu_plan_runs_xdist_with_timeout_junit_and_triton_cache():
    plan = plan_lane(load_lane("cpu"), capability=None, k="parity")
    args = plan.pytest_args
    assert args[args.index("-n") + 1] == "2"
    assert args[args.index("--dist") + 1] == "worksteal"  # no test waits behind a long one on a busy worker
    assert args[args.index("--timeout") + 1] == "300"
    assert args[args.index("--junitxml") + 1] == "reports/out/cpu/junit.xml"
    assert args[args.index("--size") + 1] == "tiny"
    assert args[args.index("-k") + 1] == "parity"
    assert "selgate.lanes.xdist_gpu" in args and "selgate.reports.stamp" in args
    assert "lanes/test_lane_policy.py" in args
    assert plan.env["TRITON_INTERPRET"] == "1" and plan.env["SELGATE_LANE"] == "cpu"
    assert "SELGATE_CUDA_BUILD" not in plan.env
    assert plan.env["TRITON_CACHE_DIR"].endswith("triton/cpu-cpu")


def test_gpu_lane_refuses_the_wrong_device_unless_emulated(monkeypatch):
    monkeypatch.delenv("SELGATE_CUDA_BUILD", raising=False)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        plan_lane(load_lane("sm90"), capability=None)
    with pytest.raises(ValueError, match=r"this device has 9.0; pass --emulate"):
        plan_lane(load_lane("sm89"), capability="9.0", gpus=1)
    plan = plan_lane(load_lane("sm89"), capability="9.0", gpus=2, emulate=True, policy_only=True)
    assert plan.env["SELGATE_CAPABILITY"] == "8.9"
    assert plan.env["SELGATE_CUDA_BUILD"] == "1"  # built at collection, outside per-test timeouts
    monkeypatch.setenv("SELGATE_CUDA_BUILD", "0")  # the caller's own setting passes through untouched
    assert "SELGATE_CUDA_BUILD" not in plan_lane(load_lane("sm89"), capability="9.0", gpus=1, emulate=True).env
    assert plan.out_name == "sm89-emulated"
    assert plan.env["TRITON_CACHE_DIR"].endswith("triton/sm89-emulated-sm90")
    assert "lanes/test_lane_policy.py" in plan.pytest_args and "conformance" not in plan.pytest_args
    assert plan.pytest_args[plan.pytest_args.index("-n") + 1] == "2"  # one worker per GPU


def test_gpu_lane_without_visible_gpus_fails_clearly():
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES leaves no GPU visible"):
        plan_lane(load_lane("sm90"), capability="9.0", gpus=0)


def test_docker_runs_hand_the_plan_to_the_docker_backend(tmp_path, monkeypatch):
    import sys
    import types

    from selgate.lanes import runner

    calls = []
    fake = types.ModuleType("selgate.lanes.docker_backend")
    fake.run_lane_in_docker = lambda lane_cfg, **kw: calls.append((lane_cfg, kw)) or 7
    monkeypatch.setitem(sys.modules, "selgate.lanes.docker_backend", fake)
    monkeypatch.setattr(runner, "OUT_ROOT", tmp_path / "out")
    monkeypatch.setenv("SELGATE_CACHE_DIR", str(tmp_path / "cache"))
    plan = plan_lane(load_lane("cpu"), capability=None)
    assert runner.run_plan(plan, docker=True) == 7
    ((lane_cfg, kw),) = calls
    assert lane_cfg["name"] == "cpu" and kw["pytest_args"] == plan.pytest_args
    assert kw["reports_dir"] == tmp_path / "out" / "cpu" and kw["cache_dir"] == tmp_path / "cache" / "triton" / "cpu-cpu"
    assert kw["env"]["TRITON_INTERPRET"] == "1" and "TRITON_CACHE_DIR" not in kw["env"]  # the image sets its own


def test_a_run_that_writes_nothing_leaves_no_old_results_behind(tmp_path, monkeypatch):
    """A lane run that dies before pytest writes its JUnit (engine, build or usage error)
    must not leave the previous run's passing results for the gate to read."""
    import sys
    import types

    from selgate.lanes import runner

    fake = types.ModuleType("selgate.lanes.docker_backend")
    fake.run_lane_in_docker = lambda lane_cfg, **kw: 125
    monkeypatch.setitem(sys.modules, "selgate.lanes.docker_backend", fake)
    monkeypatch.setattr(runner, "OUT_ROOT", tmp_path / "out")
    monkeypatch.setenv("SELGATE_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out" / "cpu"
    out.mkdir(parents=True)
    for name in ("junit.xml", "environment.json"):
        (out / name).write_text("from an earlier run")
    assert runner.run_plan(plan_lane(load_lane("cpu"), capability=None), docker=True) == 125
    assert not (out / "junit.xml").exists() and not (out / "environment.json").exists()


def test_perf_smoke_is_a_boolean_of_gpu_lanes(tmp_path):
    _write_lane(tmp_path, perf_smoke="yes")
    with pytest.raises(ValueError, match="perf_smoke: expected true or false, got 'yes'"):
        load_lane("x", tmp_path)
    _write_lane(tmp_path, device="cpu", workers=2, perf_smoke=True)
    with pytest.raises(ValueError, match="perf_smoke: times GPU kernels; the lane runs on 'cpu'"):
        load_lane("x", tmp_path)
    assert load_lane("sm90")["perf_smoke"] and not load_lane("cpu")["perf_smoke"]


@pytest.mark.parametrize(
    "narrowed, smoke",
    [({}, True), ({"k": "parity"}, False), ({"emulate": True}, False), ({"policy_only": True}, False),
     ({"extra": ["-x"]}, False)],
)  # fmt: skip
def test_only_a_whole_native_run_times_the_perf_smoke(narrowed, smoke):
    """A narrowed run measured less than the lane: its smoke would judge a run the gate blocks anyway."""
    capability = "8.0" if narrowed.get("emulate") else "9.0"
    plan = plan_lane(load_lane("sm90"), capability=capability, workers=1, **narrowed)
    assert plan.smoke is smoke
