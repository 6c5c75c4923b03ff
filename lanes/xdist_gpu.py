"""pytest plugin for lanes (`-p selgate.lanes.xdist_gpu`): one GPU per xdist worker, and a
worker whose CUDA context is poisoned ends itself.

Pinning happens in `pytest_load_initial_conftests`, before any conftest can initialise CUDA
(the driver reads CUDA_VISIBLE_DEVICES once, at init). Worker gwN takes the N-th entry of the
CUDA_VISIBLE_DEVICES it inherited (wrapping around when workers outnumber GPUs), so a runner
that was handed GPUs "4,5" uses 4 and 5, never 0.

After an illegal memory access (and the other sticky CUDA errors) every later CUDA call in
the process fails, which would smear one kernel bug over the rest of the worker's tests.
So once the faulting test's reports are sent, the worker exits: xdist records the crash
as that test's error and restarts a clean worker for the remaining tests.
"""

from __future__ import annotations

import os

import pytest

STICKY_CUDA_ERRORS = (
    "illegal memory access",
    "unspecified launch failure",
    "misaligned address",
    "an illegal instruction was encountered",
    "device-side assert triggered",
    "CUDA_ERROR_ILLEGAL_ADDRESS",
)
POISONED_EXIT_CODE = 86
_poisoned: list = []


def worker_device(worker: str | None, visible: str | None, count: int) -> str | None:
    """The CUDA_VISIBLE_DEVICES entry for xdist worker `worker` ("gw3"), given the inherited
    CUDA_VISIBLE_DEVICES (`visible`, None when unset) and the device count used when unset.
    None when not an xdist worker or when no GPU is visible."""
    if not worker:
        return None
    if visible is None:
        devices = [str(i) for i in range(count)]
    else:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
    if not devices:
        return None
    if not worker.startswith("gw") or not worker[2:].isdigit():
        raise ValueError(f"PYTEST_XDIST_WORKER: expected 'gw<N>', got {worker!r}")
    return devices[int(worker[2:]) % len(devices)]


def _device_count() -> int:
    """Visible NVIDIA devices without initialising CUDA; skips importing torch (seconds
    per restarted worker) on machines without an NVIDIA driver."""
    if not os.path.exists("/proc/driver/nvidia/gpus") and not os.path.exists("/dev/nvidia0"):
        return 0
    import torch  # NVML-based count: does not initialise CUDA

    return torch.cuda.device_count()


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not worker:
        return
    device = worker_device(worker, visible, _device_count() if visible is None else 0)
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device


def is_sticky_cuda_error(text: str) -> bool:
    return any(s in text for s in STICKY_CUDA_ERRORS)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    """Runs after xdist has sent the report; exits after the poisoned test's teardown."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    # a declared known bug (strict xfail) that raised one poisons the worker just the same
    if (report.failed or hasattr(report, "wasxfail")) and is_sticky_cuda_error(str(report.longrepr)):
        _poisoned.append(report.nodeid)
    if report.when == "teardown" and _poisoned:
        os._exit(POISONED_EXIT_CODE)
