"""Lane definitions: `lanes/<name>.yaml`, validated on load so that a typo fails before a
lane runs for an hour rather than after."""

from __future__ import annotations

import json
import math
from pathlib import Path

from selgate.conformance.sizes import SIZES
from selgate.conformance.tolerances import ENV as TOL_ENV  # the variable the matrix reads overrides from
from selgate.conformance.tolerances import parse_overrides, check_bound
from selgate import strict_yaml
from selgate.conformance.reported import names

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
    "perf_smoke",
)
IMAGE_KEYS = ("dockerfile", "base_image", "build_args", "tag")
NOTES = ("reason", "measured")  # what an override says about itself; the rest are bounds
# An overridden bound may be at most this many times the largest error measured for it: room for
# the error of cases and devices the measurement did not see, not for a bound no measurement backs.
MAX_OVERRIDE_MARGIN = 4


def lane_names(lane_dir: Path = LANE_DIR) -> list[str]:
    return sorted(p.stem for p in Path(lane_dir).glob("*.yaml"))


def load_lane(name: str, lane_dir: Path = LANE_DIR) -> dict:
    """The lane's YAML as a dict with `name` added; raises ValueError naming the file, the
    line and the bad key (an unknown or repeated key included)."""
    path = Path(lane_dir) / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"lane: no {path.name} in {lane_dir} (known lanes: {', '.join(lane_names(lane_dir))})")
    doc = strict_yaml.load(path)
    lane = doc.data if doc.data is not None else {}
    validate_lane(lane, where=str(path), at=doc.where)
    return {"name": name, **lane}


def validate_lane(lane: dict, where: str, at=None) -> None:
    """ValueError naming `where` (the file) and, with `at` (a key path -> `file:line`), the line."""
    at = at or (lambda *keys: where)
    if not isinstance(lane, dict):
        raise ValueError(f"{where}: expected a mapping of {list(REQUIRED)}, got {type(lane).__name__}")
    missing = [k for k in REQUIRED if k not in lane]
    if missing:
        raise ValueError(f"{where}: missing keys {missing}; a lane needs {list(REQUIRED)}")
    for key in lane:
        if key not in REQUIRED:
            raise ValueError(f"{at(key)}: {key}: unknown key; a lane has exactly {list(REQUIRED)}")
    if lane["device"] not in ("cpu", "cuda"):
        raise ValueError(f"{at('device')}: device: expected 'cpu' or 'cuda', got {lane['device']!r}")
    if lane["size"] not in SIZES:
        raise ValueError(f"{at('size')}: size: expected one of {SIZES}, got {lane['size']!r}")
    workers = lane["workers"]
    if workers not in ("gpus", "per_gpu") and not (isinstance(workers, int) and not isinstance(workers, bool) and workers >= 1):
        raise ValueError(
            f"{at('workers')}: workers: expected an integer >= 1 (a crashed test needs a worker to die "
            f"in), 'gpus' (one per visible GPU) or 'per_gpu' (as many per GPU as its memory "
            f"and the CPUs allow), got {workers!r}"
        )
    if workers in ("gpus", "per_gpu") and lane["device"] != "cuda":
        raise ValueError(f"{at('workers')}: workers: {workers!r} needs device cuda, the lane runs on {lane['device']!r}")
    families = lane["required_families"]
    if not isinstance(families, list) or not all(isinstance(f, str) for f in families):
        raise ValueError(f"{at('required_families')}: required_families: expected a list of families, got {families!r}")
    unknown = sorted(set(families) - set(names()))
    if unknown:
        raise ValueError(f"{at('required_families')}: required_families: unknown {unknown}; families are {list(names())}")
    if not isinstance(lane["env"], dict):
        raise ValueError(f"{at('env')}: env: expected a mapping of environment variables, got {lane['env']!r}")
    image = lane["image"]
    if isinstance(image, dict):
        for key in image:
            if key not in IMAGE_KEYS:
                raise ValueError(f"{at('image', key)}: image.{key}: unknown key; expected one of {list(IMAGE_KEYS)}")
    elif not (isinstance(image, str) and image):
        raise ValueError(f"{at('image')}: image: expected a mapping of {list(IMAGE_KEYS)} or an image tag, got {image!r}")
    overrides = lane["tolerance_overrides"] if lane["tolerance_overrides"] is not None else {}
    if not isinstance(overrides, dict):
        raise ValueError(
            f"{at('tolerance_overrides')}: tolerance_overrides: expected a mapping keyed by dtype, got {overrides!r}"
        )
    for dtype, override in overrides.items():
        _check_override(dtype, override, at)
    try:
        parse_overrides(tolerance_env(lane).get(TOL_ENV, ""))
    except ValueError as e:
        raise ValueError(f"{at('tolerance_overrides')}: tolerance_overrides: {e}") from None
    for dtype, override in overrides.items():
        _check_measured(dtype, override, at)
    if not isinstance(lane["perf_smoke"], bool):
        raise ValueError(f"{at('perf_smoke')}: perf_smoke: expected true or false, got {lane['perf_smoke']!r}")
    if lane["perf_smoke"] and lane["device"] != "cuda":
        raise ValueError(f"{at('perf_smoke')}: perf_smoke: times GPU kernels; the lane runs on {lane['device']!r}")
    checks = lane["policy"]
    if not isinstance(checks, list):
        raise ValueError(f"{at('policy')}: policy: expected a list of checks, got {checks!r}")
    for i, check in enumerate(checks):
        if (
            not isinstance(check, dict)
            or set(check) != {"name", "env", "triton_launches"}
            or not isinstance(check["triton_launches"], bool)
        ):
            raise ValueError(
                f"{at('policy', i)}: policy[{i}]: expected keys name, env and a boolean triton_launches, got {check!r}"
            )


def _leaves(mapping: dict) -> dict:
    """{(key,) or (tensor, key): value} of an override's bounds or measurements (a tensor key
    such as `dk` or `grad` narrows its fields to that tensor)."""
    out = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out.update({(key, field_): v for field_, v in value.items()})
        else:
            out[(key,)] = value
    return out


def _check_override(dtype, override, at) -> None:
    """An override has a reason, its measurements, and finite bounds >= 0."""
    if not isinstance(override, dict) or not str(override.get("reason", "")).strip() or "measured" not in override:
        raise ValueError(
            f"{at('tolerance_overrides', dtype)}: tolerance_overrides.{dtype}: every override needs a 'reason' and "
            f"'measured' (the largest error measured, per field it loosens), got {override!r}"
        )
    bounds = _leaves({k: v for k, v in override.items() if k not in NOTES})
    if not bounds:
        raise ValueError(f"{at('tolerance_overrides', dtype)}: tolerance_overrides.{dtype}: sets no bound, got {override!r}")
    for path, value in bounds.items():
        check_bound(value, f"{at('tolerance_overrides', dtype, *path)}: tolerance_overrides: {dtype}.{'.'.join(map(str, path))}")


def _check_measured(dtype, override, at) -> None:
    """Every bound an override sets has its measured error beside it (`measured`, the same keys),
    and is at most MAX_OVERRIDE_MARGIN times it: a bound far above anything measured is not
    tied to a measurement."""
    measured = override["measured"]
    here = f"{at('tolerance_overrides', dtype, 'measured')}: tolerance_overrides: {dtype}.measured"
    if not isinstance(measured, dict):
        check_bound(measured, here)
        raise ValueError(
            f"{here}: expected the measured error per field the override sets, e.g. {{factor: 2.6}} "
            f"beside factor: 3, got {measured!r}"
        )
    bounds = _leaves({k: v for k, v in override.items() if k not in NOTES})
    errors = _leaves(measured)
    for path, value in errors.items():
        name = ".".join(map(str, path))
        if path not in bounds:
            raise ValueError(
                f"{at('tolerance_overrides', dtype, 'measured', *path)}: tolerance_overrides: {dtype}.measured.{name}: "
                f"unknown key; measured names the fields the override sets: {['.'.join(map(str, p)) for p in bounds]}"
            )
        check_bound(value, f"{at('tolerance_overrides', dtype, 'measured', *path)}: tolerance_overrides: {dtype}.measured.{name}")
    for path, bound in bounds.items():
        name = ".".join(map(str, path))
        if path not in errors:
            raise ValueError(
                f"{here}: no measured error for {name}: every bound an override sets needs the largest "
                f"error measured for it, under the same keys in measured"
            )
        if bound > MAX_OVERRIDE_MARGIN * errors[path]:
            raise ValueError(
                f"{at('tolerance_overrides', dtype, *path)}: tolerance_overrides: {dtype}.{name}: {bound!r} is more "
                f"than {MAX_OVERRIDE_MARGIN}x the measured {errors[path]!r}: a bound may be at most "
                f"{MAX_OVERRIDE_MARGIN}x the largest error measured"
            )


def tolerance_env(lane: dict) -> dict:
    """`{TOL_ENV: json}` with the lane's overrides minus their reasons and measurements; empty
    when none. The JSON is read back as YAML 1.1 (`parse_overrides`), where `2e-05` would be a
    string: a float in exponent form is written with a '.' (`2.0e-05`), as YAML 1.1 needs."""
    overrides = {
        dtype: {k: v for k, v in o.items() if k not in NOTES}
        for dtype, o in (lane["tolerance_overrides"] or {}).items()
        if isinstance(o, dict)
    }
    return {TOL_ENV: _yaml11_json(overrides)} if overrides else {}


def _yaml11_json(value) -> str:
    """`json.dumps(value, sort_keys=True)`, but with every finite float in a spelling YAML 1.1
    reads as a float (`repr` keeps its exact value; `2e-05` becomes `2.0e-05`)."""
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_yaml11_json(v)}" for k, v in items) + "}"
    if isinstance(value, float) and math.isfinite(value):
        text = repr(value)
        return text.replace("e", ".0e", 1) if "e" in text and "." not in text else text
    return json.dumps(value)
