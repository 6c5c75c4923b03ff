"""The dispatcher's policy: flags, compute capability and what the Triton kernel supports.

Precedence for every setting: `configs/base.yaml` < `configs/classes/<class>.yaml` <
`configs/profiles/<device>.yaml` < environment variable (kernels/config.py). The SM 8.9 rule of ADR-0001 is data
(`policy.triton_sel_disabled_capabilities`), so a later measurement changes config, not code.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from dataclasses import dataclass, field

import torch

from selgate import env_vars
from selgate.device import capability_text, device_capability, forget as forget_capabilities
from . import triton_limits
from .config import load_config
from .stats import record_capability

OVERRIDES: list = []  # the capability_override() values in force, innermost last


# The variables that steer the dispatcher (tests clear them all for a known state).
ENV_FLAGS = tuple(name for name, var in env_vars.VARS.items() if var.group == "dispatcher")


@dataclass(frozen=True)
class DispatchPolicy:
    """The dispatcher's view of config and flags (env over device profile over base.yaml),
    resolved once per (device, flag values) and cached (`dispatch_policy`)."""

    use_triton: bool  # SELGATE_TRITON_ENABLE
    force_triton: bool  # SELGATE_TRITON_FORCE: ignore ADR policy, min-L and SELGATE_TRITON_ENABLE
    min_L: int  # SELGATE_TRITON_MIN_L
    force_parity: bool  # SELGATE_FORCE_PARITY: route everything to the fp64 reference
    strict: bool  # SELGATE_STRICT
    allow_grad: bool  # SELGATE_TRITON_ALLOW_GRAD
    validate: bool  # SELGATE_VALIDATE_RANGES: reject ranges breaking the producer contract
    use_cuda: bool  # SELGATE_CUDA_ENABLE: try the CUDA decode kernel first
    disabled_caps: tuple  # policy.triton_sel_disabled_capabilities
    min_cap: str  # policy.triton_sel_min_capability
    budget_bytes: int  # runtime.sdpa_budget_mb: gathered K/V per chunk in the sdpa and reference paths
    triton_normalize: bool = True  # SELGATE_TRITON_NORMALIZE: normalise CUDA ranges in one Triton launch
    capability_env: str | None = None  # SELGATE_CAPABILITY, checked
    interpret: bool = False  # TRITON_INTERPRET=1
    debug: bool = False  # SELGATE_DEBUG_LOG
    kept: dict = field(default_factory=dict, compare=False, repr=False)  # kept calls under this policy (kept.py)


# What a policy is resolved from besides the config files: its cache key, read per call.
_KEYS = (*ENV_FLAGS, "TRITON_INTERPRET")
_policies: dict = {}


def _resolve(device_name: str | None) -> DispatchPolicy:
    cfg = load_config(device_name)
    rt, pol = cfg["runtime"], cfg["policy"]
    over = env_vars.get("SELGATE_CAPABILITY")
    if over is not None:
        _parse_cap(over, "SELGATE_CAPABILITY")
    return DispatchPolicy(
        use_triton=env_vars.get("SELGATE_TRITON_ENABLE", rt["use_triton_sel"]),
        force_triton=env_vars.get("SELGATE_TRITON_FORCE"),
        min_L=int(env_vars.get("SELGATE_TRITON_MIN_L", rt["sel_triton_min_L"])),
        force_parity=env_vars.get("SELGATE_FORCE_PARITY"),
        strict=env_vars.get("SELGATE_STRICT"),
        allow_grad=env_vars.get("SELGATE_TRITON_ALLOW_GRAD", rt["sel_triton_allow_grad"]),
        validate=env_vars.get("SELGATE_VALIDATE_RANGES"),
        use_cuda=env_vars.get("SELGATE_CUDA_ENABLE"),
        disabled_caps=tuple(str(c) for c in pol["triton_sel_disabled_capabilities"]),
        min_cap=str(pol["triton_sel_min_capability"]),
        budget_bytes=int(rt["sdpa_budget_mb"]) << 20,
        triton_normalize=env_vars.get("SELGATE_TRITON_NORMALIZE"),
        capability_env=over,
        interpret=os.environ.get("TRITON_INTERPRET", "0") == "1",
        debug=env_vars.get("SELGATE_DEBUG_LOG"),
    )


def dispatch_policy(device_name: str | None = None) -> DispatchPolicy:
    """The policy in force: parsed when a flag's text changed since the last call, else one
    dictionary lookup per flag (`env_vars.raw`). Config files are read once per process;
    `reload_settings()` re-reads them."""
    key = (device_name, env_vars.raw(_KEYS))
    hit = _policies.get(key)
    if hit is None:
        if len(_policies) > 64:  # a test suite walks many flag sets; keep the cache small
            _policies.clear()
        hit = _policies[key] = _resolve(device_name)
    return hit


def reload_settings() -> None:
    """Forget everything resolved once per process: config files and device profiles, the
    policies built from them, device capabilities, the Triton launch selections and the
    launches `triton/launch.py` keeps. Tests and tools that edit configs/ or a tuned file call
    it; environment flags need no call (each call sees their current text)."""
    from . import config

    config.cache_clear()
    _policies.clear()
    forget_capabilities()
    if "selgate.kernels.triton.tuning" in sys.modules:
        sys.modules["selgate.kernels.triton.tuning"].clear_cache()
    if "selgate.kernels.triton.launch" in sys.modules:
        sys.modules["selgate.kernels.triton.launch"].clear()


def forget_kept_calls() -> None:
    """Drop the kept calls (kept.py) of every cached policy, keeping all else resolved: for a
    test or tool that patches a part of the ladder and must see its next call take the ladder."""
    for st in list(_policies.values()):
        st.kept.clear()


@contextlib.contextmanager
def capability_override(cap: str):
    """Pretend the device has compute capability `cap` (e.g. "8.9") inside the block.
    Takes precedence over SELGATE_CAPABILITY; both show in logs and `stats()`."""
    _parse_cap(cap, "capability_override")
    OVERRIDES.append(str(cap))
    try:
        yield
    finally:
        OVERRIDES.pop()


@functools.lru_cache(maxsize=64)
def _parse_cap(cap: str, name: str) -> tuple:
    try:
        major, minor = (int(x) for x in str(cap).split("."))
    except ValueError:
        raise ValueError(f"{name}: expected a compute capability like '8.9', got {cap!r}") from None
    return major, minor


def capability_overridden(st: DispatchPolicy | None = None) -> str | None:
    """The override in force (context manager first, then SELGATE_CAPABILITY), or None."""
    if OVERRIDES:
        return OVERRIDES[-1]
    return (st or dispatch_policy()).capability_env


def capability_source(device: torch.device, st: DispatchPolicy | None = None) -> tuple[str | None, str]:
    """`(capability, "override" or "device")` the policy uses for `device`; None for a CPU without override."""
    over = capability_overridden(st)
    if over is not None:
        return over, "override"
    return capability_text(device_capability(device)), "device"


def capability(device: torch.device, st: DispatchPolicy | None = None) -> str | None:
    """Compute capability the policy uses for `device` (recorded for `stats()`); None for a CPU without override."""
    cap, source = capability_source(device, st)
    if cap is not None:
        record_capability(cap, source)
    return cap


def interpreting() -> bool:
    return dispatch_policy().interpret


def triton_unsupported(q, Dk: int, Dv: int, cap: str | None, st: DispatchPolicy):
    """Why the Triton kernel cannot (or, by ADR policy, must not) serve this call, as
    `(reason, detail)`, or None when it can: the kernels' own limits (`triton_limits`), then
    capability and the ADR rule, which yields to SELGATE_TRITON_FORCE."""
    why = triton_limits.unsupported(q, Dk, Dv, st.interpret)
    if why is not None:
        return why
    if cap is not None:
        if _parse_cap(cap, "capability") < _parse_cap(st.min_cap, "policy.triton_sel_min_capability"):
            return "capability", f"SM {cap} is below policy.triton_sel_min_capability={st.min_cap}"
        if cap in st.disabled_caps and not st.force_triton:
            return "adr_policy", (
                f"SM {cap} is in policy.triton_sel_disabled_capabilities (ADR-0001); set SELGATE_TRITON_FORCE=1 to run it"
            )
    return None
