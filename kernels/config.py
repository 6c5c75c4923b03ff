"""Runtime configuration: `configs/base.yaml`, overridden by the running device's profile
`configs/profiles/<device-slug>.yaml`; environment variables override both (the
dispatcher reads them). Measured decisions therefore change data, not code."""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path

import yaml

from . import env_vars

CONFIG_DIR = env_vars.get("SELGATE_CONFIG_DIR") or Path(__file__).resolve().parent.parent / "configs"


def device_slug(name: str) -> str:
    """File-name form of a device name: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def current_device_name() -> str:
    """Name of the device selgate runs on: the current CUDA device, else 'cpu'."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def profile_path(device_name: str) -> Path:
    return CONFIG_DIR / "profiles" / f"{device_slug(device_name)}.yaml"


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, val in (over or {}).items():
        out[key] = _merge(out.get(key, {}), val) if isinstance(val, dict) else val
    return out


@functools.lru_cache(maxsize=None)
def load_config(device_name: str | None = None) -> dict:
    """Base config merged with the profile of `device_name` (default: the current device)."""
    base = yaml.safe_load((CONFIG_DIR / "base.yaml").read_text())
    path = profile_path(device_name or current_device_name())
    profile = yaml.safe_load(path.read_text()) if path.exists() else {}
    merged = _merge(base, profile)
    merged["_profile"] = str(path) if path.exists() else None
    return merged
