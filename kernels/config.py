"""Runtime configuration, by GPU class refined by device: `configs/base.yaml`, overridden by the
profile of the running GPU's class `configs/classes/<class>.yaml` (sm80, sm89, sm90: what was
measured for every GPU of that compute capability), overridden by the device's own profile
`configs/profiles/<device-slug>.yaml` (only what was measured on that device); environment
variables override all three (the dispatcher reads them). Measured decisions therefore change
data, not code, and an H200, H800 or GH200 with no profile of its own runs the sm90 class's.

The class follows the device's real compute capability, never `SELGATE_CAPABILITY` or
`capability_override` (those steer the dispatcher's policy; launches are tuned for the
hardware that runs them)."""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Optional

import yaml

from selgate import env_vars

CONFIG_DIR = env_vars.get("SELGATE_CONFIG_DIR") or Path(__file__).resolve().parent.parent / "configs"


def device_slug(name: str) -> str:
    """File-name form of a device name: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def current_device_name() -> str:
    """Name of the device selgate runs on: the current CUDA device, else 'cpu'."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def current_capability() -> Optional[tuple]:
    """(major, minor) of the current CUDA device, None without one."""
    import torch

    return tuple(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None


def class_path(cls: str) -> Path:
    return CONFIG_DIR / "classes" / f"{cls}.yaml"


@functools.lru_cache(maxsize=None)
def _class_files() -> dict:
    """{class: its parsed yaml} of every configs/classes/*.yaml (each lists its `capabilities`)."""
    folder = CONFIG_DIR / "classes"
    return {p.stem: yaml.safe_load(p.read_text()) or {} for p in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}


def device_class(capability) -> Optional[str]:
    """The GPU class ('sm90') whose profile lists `capability` ((9, 0) or '9.0'), else None."""
    if capability is None:
        return None
    text = capability if isinstance(capability, str) else f"{capability[0]}.{capability[1]}"
    return next((c for c, data in _class_files().items() if text in [str(x) for x in data.get("capabilities", ())]), None)


def profile_path(device_name: str) -> Path:
    return CONFIG_DIR / "profiles" / f"{device_slug(device_name)}.yaml"


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, val in (over or {}).items():
        out[key] = _merge(out.get(key, {}), val) if isinstance(val, dict) else val
    return out


# Keys of a class file that describe the class, not settings.
CLASS_KEYS = ("capabilities", "bench_baseline", "measured_on")


@functools.lru_cache(maxsize=None)
def load_config(device_name: str | None = None, capability=None) -> dict:
    """base.yaml < the class profile < the device profile of `device_name` (default: the current
    device, with its capability; a named device is classed by `capability`, (9, 0) or '9.0').
    `_profile` says which files served: {"device": path|None, "class": name|None, "class_path":
    path|None, "served_by": "device" | "class" | "none"} (`profile_source`)."""
    if device_name is None:
        device_name, capability = current_device_name(), current_capability()
    base = yaml.safe_load((CONFIG_DIR / "base.yaml").read_text())
    cls = device_class(capability)
    cls_data = {k: v for k, v in (_class_files().get(cls) or {}).items() if k not in CLASS_KEYS}
    path = profile_path(device_name)
    profile = yaml.safe_load(path.read_text()) if path.exists() else {}
    merged = _merge(_merge(base, cls_data), profile)
    merged["_profile"] = {
        "device_name": device_name,
        "device": str(path) if path.exists() else None,
        "class": cls,
        "class_path": str(class_path(cls)) if cls else None,
        "served_by": "device" if path.exists() else "class" if cls_data else "none",
    }
    return merged


def profile_source(cfg: dict | None = None) -> dict:
    """Which profile files served `cfg` (default: the current device's config)."""
    return dict((load_config() if cfg is None else cfg)["_profile"])


def cache_clear() -> None:
    """Forget the parsed config and class files (after editing configs/)."""
    load_config.cache_clear()
    _class_files.cache_clear()
