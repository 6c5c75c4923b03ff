"""Which configuration files served a run's launches (kernels/config.py,
kernels/triton/tuning.py), added to the environment stamp of every result this package's
kernels produced."""

from __future__ import annotations

from selgate.environment import collect_environment, device_environment, process_environment


def run_environment(device: dict | None = None) -> dict:
    """The environment stamp (`selgate.environment`) with `served_by_text`'s keys; `device`
    (`served_device`'s, from a process that ran the tests) in place of this process's own."""
    if device is None:
        return {**collect_environment(), **served_by_text()}
    return {**process_environment(), **device}


def served_device() -> dict:
    """The keys of the stamp that need torch: the device, software and serving configuration."""
    return {**device_environment(), **served_by_text()}


def served_by_text() -> dict:
    """`gpu_class`, `profile` and `tuned`: which configuration files served the run's launches
    (kernels/config.py, kernels/triton/tuning.py), as the reports print them."""
    import torch

    from . import config

    prof = config.profile_source()
    where = {"device": f"device {prof['device']}", "class": f"class {prof['class_path']}", "none": "none (base.yaml)"}
    text = where[prof["served_by"]]
    if prof["served_by"] == "device" and prof["class"]:
        text += f" over class {prof['class']}"
    out = {"gpu_class": prof["class"] or "none", "profile": text, "tuned": "none (no GPU: the interpreter's launches)"}
    if torch.cuda.is_available():
        try:
            from .triton import tuning

            status = tuning.tuning_status()
            out["tuned"] = f"{status['served_by']} {status['path'] or ''}".strip() + f"; autotune {status['autotune']}"
        except Exception as e:  # noqa: BLE001 - a stamp says what it could not read, it does not fail the lane
            out["tuned"] = f"unknown ({type(e).__name__}: {e})"
    return out
