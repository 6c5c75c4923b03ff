"""Autotune persistence: the best Triton configs per device and Triton version, as JSON.

A `triton.autotune`d kernel keeps its choices in `Autotuner.cache` (tuning key -> Config)
for the life of the process. `save` writes those choices to
`configs/autotune/<device-slug>/triton-<version>.json`; `load` puts them back into the
autotuners of a fresh process, so a known key never tunes again. Kernels stay untouched:
the autotuners are found in the loaded `selgate.kernels.triton` modules by duck typing
(an object with a `cache` dict and a `configs` list), so this works for any kernel there.
`SELGATE_AUTOTUNE_CACHE` overrides the file.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from selgate.kernels.config import CONFIG_DIR, current_device_name, device_slug

KERNEL_PACKAGE = "selgate.kernels.triton"


def cache_file(device_name: str | None = None, triton_version: str | None = None) -> Path:
    if os.environ.get("SELGATE_AUTOTUNE_CACHE"):
        return Path(os.environ["SELGATE_AUTOTUNE_CACHE"])
    if triton_version is None:
        import triton

        triton_version = triton.__version__
    return CONFIG_DIR / "autotune" / device_slug(device_name or current_device_name()) / f"triton-{triton_version}.json"


def autotuners() -> dict[str, object]:
    """`module.name -> Autotuner` for every autotuned kernel already imported from KERNEL_PACKAGE."""
    found = {}
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith(KERNEL_PACKAGE):
            continue
        for name, obj in vars(mod).items():
            if isinstance(getattr(obj, "cache", None), dict) and isinstance(getattr(obj, "configs", None), list):
                found[f"{mod_name}.{name}"] = obj
    return found


def config_to_dict(cfg) -> dict:
    return {"kwargs": dict(cfg.kwargs), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
            "num_ctas": getattr(cfg, "num_ctas", 1)}


def describe(cfg) -> str:
    """'BLOCK_L=64,num_warps=4,num_stages=2': one CSV cell."""
    d = config_to_dict(cfg)
    return ",".join([*(f"{k}={v}" for k, v in d["kwargs"].items()), f"num_warps={d['num_warps']}",
                     f"num_stages={d['num_stages']}"])


def save(tuners: dict[str, object] | None = None, path: Path | None = None) -> Path:
    """Merge the tuned choices of `tuners` (default: all found) into the JSON cache file."""
    path = Path(path or cache_file())
    data = json.loads(path.read_text()) if path.exists() else {}
    for name, tuner in (autotuners() if tuners is None else tuners).items():
        entries = {json.dumps(e["key"]): e for e in data.get(name, [])}
        for key, cfg in tuner.cache.items():
            entries[json.dumps(list(key))] = {"key": list(key), **config_to_dict(cfg)}
        data[name] = list(entries.values())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def load(tuners: dict[str, object] | None = None, path: Path | None = None) -> int:
    """Seed the autotuners' caches from the JSON file; returns how many choices were loaded."""
    path = Path(path or cache_file())
    if not path.exists():
        return 0
    import triton

    data = json.loads(path.read_text())
    count = 0
    for name, tuner in (autotuners() if tuners is None else tuners).items():
        for e in data.get(name, []):
            tuner.cache[tuple(e["key"])] = triton.Config(e["kwargs"], num_warps=e["num_warps"],
                                                         num_stages=e["num_stages"], num_ctas=e.get("num_ctas", 1))
            count += 1
    return count
