"""The environment stamp: what a lane's results were produced on (GPU, capability, driver,
CUDA, torch, triton, commit, tolerance overrides and capability override in effect). Which
configuration served the kernels is theirs to say (`selgate.kernels.served`)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess

from . import env_vars

from .tree import commit

ENV_FILE = "environment.json"


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def collect_environment() -> dict:
    """The whole stamp of this process: `process_environment` and `device_environment`."""
    return {**process_environment(), **device_environment()}


def process_environment() -> dict:
    """What the process knows without torch: lane, host, settings in effect, commit, time."""
    return {
        "lane": env_vars.get("SELGATE_LANE", "adhoc"),
        "host": platform.node(),
        "python": platform.python_version(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
        "gpus_visible": os.environ.get("CUDA_VISIBLE_DEVICES", "all"),
        "capability_override": env_vars.get("SELGATE_CAPABILITY") or "none",
        "tolerance_overrides": env_vars.get("SELGATE_TOL_OVERRIDES") or "none",
        "commit": commit(),
        "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


DEVICE_KEYS = ("torch", "cuda", "triton", "gpu", "capability", "driver")


def device_environment() -> dict:
    """`DEVICE_KEYS`: the software and the GPU the tests ran on (imports torch: a lane's xdist
    workers, which have it, send theirs to the controller, which need not import it)."""
    import torch

    from .device import capability_text, device_capability

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    env = {
        "torch": str(torch.__version__),  # a str subclass that execnet cannot send
        "cuda": torch.version.cuda or "none",
        "triton": triton_version,
        "gpu": "none",
        "capability": "none",
        "driver": "none",
    }
    if torch.cuda.is_available():
        env.update(gpu=torch.cuda.get_device_name(0), capability=capability_text(device_capability(0)))
        driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        env["driver"] = driver.splitlines()[0] if driver else "unknown"
    return env
