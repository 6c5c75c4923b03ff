"""Lane definitions: `lanes/<name>.yaml`, validated on load so that a typo fails before a
lane runs for an hour rather than after."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from selgate.conformance.cases import SIZES
from selgate.conformance.tolerances import ENV as TOL_ENV  # the variable the matrix reads overrides from
from selgate.conformance.tolerances import parse_overrides, check_bound
from selgate.reports.families import FAMILIES

LANE_DIR = Path(__file__).resolve().parent
REQUIRED = (
    "description",
    "device",
    "capabilities",
    "size",
    "markers",
    "paths",
    "workers",
    "timeout",
    "max_worker_restart",
    "env",
    "tolerance_overrides",
    "image",
    "required_families",
    "policy",
)


def lane_names(lane_dir: Path = LANE_DIR) -> list[str]:
    return sorted(p.stem for p in Path(lane_dir).glob("*.yaml"))


def load_lane(name: str, lane_dir: Path = LANE_DIR) -> dict:
    """The lane's YAML as a dict with `name` added; raises ValueError naming the bad key."""
    path = Path(lane_dir) / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"lane: no {path.name} in {lane_dir} (known lanes: {', '.join(lane_names(lane_dir))})")
    lane = yaml.safe_load(path.read_text()) or {}
    validate_lane(lane, where=str(path))
    return {"name": name, **lane}


def validate_lane(lane: dict, where: str) -> None:
    missing = [k for k in REQUIRED if k not in lane]
    if missing:
        raise ValueError(f"{where}: missing keys {missing}; a lane needs {list(REQUIRED)}")
    if lane["device"] not in ("cpu", "cuda"):
        raise ValueError(f"{where}: device: expected 'cpu' or 'cuda', got {lane['device']!r}")
    if lane["size"] not in SIZES:
        raise ValueError(f"{where}: size: expected one of {SIZES}, got {lane['size']!r}")
    workers = lane["workers"]
    if workers not in ("gpus", "per_gpu") and not (isinstance(workers, int) and workers >= 1):
        raise ValueError(
            f"{where}: workers: expected an integer >= 1 (a crashed test needs a worker to die "
            f"in), 'gpus' (one per visible GPU) or 'per_gpu' (as many per GPU as its memory "
            f"and the CPUs allow), got {workers!r}"
        )
    if workers in ("gpus", "per_gpu") and lane["device"] != "cuda":
        raise ValueError(f"{where}: workers: {workers!r} needs device cuda, the lane runs on {lane['device']!r}")
    unknown = sorted(set(lane["required_families"]) - set(FAMILIES))
    if unknown:
        raise ValueError(f"{where}: required_families: unknown {unknown}; families are {list(FAMILIES)}")
    overrides = lane["tolerance_overrides"] or {}
    if not isinstance(overrides, dict):
        raise ValueError(f"{where}: tolerance_overrides: expected a mapping keyed by dtype, got {overrides!r}")
    for dtype, override in overrides.items():
        if not isinstance(override, dict) or not str(override.get("reason", "")).strip() or "measured" not in override:
            raise ValueError(
                f"{where}: tolerance_overrides.{dtype}: every override needs a 'reason' and "
                f"'measured' (the largest error measured, per field it loosens), got {override!r}"
            )
        measured = override["measured"]
        for field_, value in measured.items() if isinstance(measured, dict) else [(None, measured)]:
            check_bound(value, f"{where}: tolerance_overrides.{dtype}.measured" + (f".{field_}" if field_ else ""))
    try:
        parse_overrides(tolerance_env(lane).get(TOL_ENV, ""))
    except ValueError as e:
        raise ValueError(f"{where}: tolerance_overrides: {e}") from None
    for i, check in enumerate(lane["policy"]):
        if set(check) != {"name", "env", "triton_launches"} or not isinstance(check["triton_launches"], bool):
            raise ValueError(f"{where}: policy[{i}]: expected keys name, env and a boolean triton_launches, got {check!r}")


def tolerance_env(lane: dict) -> dict:
    """`{TOL_ENV: json}` with the lane's overrides minus their reasons and measurements; empty
    when none."""
    overrides = {
        dtype: {k: v for k, v in o.items() if k not in ("reason", "measured")}
        for dtype, o in (lane["tolerance_overrides"] or {}).items()
    }
    return {TOL_ENV: json.dumps(overrides, sort_keys=True)} if overrides else {}
