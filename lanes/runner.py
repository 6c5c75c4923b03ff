"""Run one lane: pytest over the lane's paths, markers and size, on xdist workers (one GPU
each), with a per-test timeout, JUnit into `reports/out/<lane>/junit.xml`, a Triton cache
per lane and architecture, and the lane's own policy checks. Locally, or in Docker through
`selgate.lanes.docker_backend`."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .config import LANE_DIR, tolerance_env
from .detect import device_capability, lane_for

ROOT = LANE_DIR.parent
OUT_ROOT = ROOT / "reports" / "out"
POLICY_TESTS = "lanes/test_lane_policy.py"


def cache_root() -> Path:
    base = os.environ.get("SELGATE_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "selgate"
    return Path(base)


@dataclass
class LanePlan:
    """Everything one lane run needs; `env` holds only what the lane adds to os.environ."""

    lane: dict
    out_name: str               # reports/out/<out_name>/
    pytest_args: list = field(default_factory=list)
    env: dict = field(default_factory=dict)
    cache_dir: Path = None
    workers: int = 1


def visible_gpu_count() -> int:
    """GPUs this process may use: the CUDA_VISIBLE_DEVICES entries when set, else all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    import torch

    return torch.cuda.device_count()


def plan_lane(lane: dict, *, capability: str | None, workers: int | None = None, k: str | None = None,
              emulate: bool = False, policy_only: bool = False, extra=(), gpus: int | None = None) -> LanePlan:
    """Build the pytest command line and environment for `lane` on a machine whose device
    has `capability` (None: no CUDA device). Raises ValueError when the lane cannot run here."""
    name = lane["name"]
    target = str(lane["capabilities"][0]) if lane["capabilities"] else None
    if lane["device"] == "cuda" and capability is None:
        raise ValueError(f"lane {name}: needs a CUDA device of capability {lane['capabilities']}; "
                         "this machine has none")
    if emulate and lane["device"] != "cuda":
        raise ValueError(f"lane {name}: --emulate needs a GPU lane, {name} runs on {lane['device']}")
    if lane["device"] == "cuda" and capability not in map(str, lane["capabilities"]) and not emulate:
        raise ValueError(f"lane {name}: expects compute capability {lane['capabilities']}, this device "
                         f"has {capability}; pass --emulate to run it under NSA_SEL_CAPABILITY={target}")
    if workers is None:
        workers = lane["workers"]
    if workers == "gpus":
        workers = visible_gpu_count() if gpus is None else gpus
        if workers < 1:
            raise ValueError(f"lane {name}: workers 'gpus' but CUDA_VISIBLE_DEVICES leaves no GPU visible")
    if workers < 1:
        raise ValueError(f"--workers: expected >= 1 (a crashing test needs a worker to die in), got {workers}")

    out_name = f"{name}-emulated" if emulate else name
    arch = f"sm{capability.replace('.', '')}" if capability else "cpu"
    env = {k_: str(v) for k_, v in (lane["env"] or {}).items()}
    env.update(tolerance_env(lane))
    if lane["device"] == "cuda" and "NSA_SEL_CUDA_BUILD" not in os.environ:
        # Each worker builds (or loads) the CUDA decode extension when it imports it during
        # collection, outside any per-test timeout that could kill a build half-way; the
        # builders take turns (kernels/cuda/build.py). The caller's own setting wins.
        env.setdefault("NSA_SEL_CUDA_BUILD", "1")
    env["SELGATE_LANE"] = out_name
    if emulate:
        env["NSA_SEL_CAPABILITY"] = target
    cache_dir = cache_root() / "triton" / f"{out_name}-{arch}"
    env["TRITON_CACHE_DIR"] = str(cache_dir)

    junit = f"reports/out/{out_name}/junit.xml"
    paths = [POLICY_TESTS] if policy_only else [*lane["paths"], POLICY_TESTS]
    args = [*paths, "-p", "selgate.lanes.xdist_gpu", "-p", "selgate.reports.stamp",
            "-n", str(workers), "--dist", "load", "--max-worker-restart", str(lane["max_worker_restart"]),
            "--timeout", str(lane["timeout"]), "--timeout-method", "thread",
            "--junitxml", junit, "-o", "junit_family=xunit2", "-o", "console_output_style=progress",
            "-rfE"]
    if not policy_only:   # the conformance matrix's size class (root conftest.py)
        args += ["--size", lane["size"]]
    if lane["markers"]:
        args += ["-m", lane["markers"]]
    if k:
        args += ["-k", k]
    args += list(extra)
    return LanePlan(lane, out_name, args, env, cache_dir, workers)


def run_plan(plan: LanePlan, *, docker: bool = False) -> int:
    """Run the plan; returns pytest's exit status (the gate reads the JUnit, not this)."""
    out_dir = OUT_ROOT / plan.out_name
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("junit.xml", "environment.json"):  # a run that writes nothing must not leave an old pass
        (out_dir / stale).unlink(missing_ok=True)
    plan.cache_dir.mkdir(parents=True, exist_ok=True)
    print(f"lane {plan.out_name}: {plan.workers} worker(s), JUnit -> {out_dir / 'junit.xml'}, "
          f"TRITON_CACHE_DIR={plan.cache_dir}", flush=True)
    if docker:
        from .docker_backend import run_lane_in_docker

        env = {k: v for k, v in plan.env.items() if k != "TRITON_CACHE_DIR"}
        return run_lane_in_docker(plan.lane, pytest_args=plan.pytest_args, env=env,
                                  reports_dir=out_dir, cache_dir=plan.cache_dir)
    cmd = [sys.executable, "-m", "pytest", *plan.pytest_args]
    print("+ " + shlex.join([f"{k}={v}" for k, v in plan.env.items()] + cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT, env={**os.environ, **plan.env})


def resolve_lane(name: str) -> tuple[str, str | None]:
    """(lane name, device capability); `auto` picks the lane for this machine."""
    capability, _ = device_capability()
    return (lane_for(capability) if name == "auto" else name), capability
