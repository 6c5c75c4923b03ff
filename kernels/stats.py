"""Dispatcher observability: what ran, why the fast path was left, how much K/V was read.

Counters are process-wide and read with `stats()`. Token and byte counts stay on the
device as running sums (one int64 [tokens, bytes] tensor per device, which the Triton
range normaliser adds to as it runs), so counting never synchronises the hot path;
`stats()` reads them. With `SELGATE_DEBUG_LOG=1` every decision is logged as a `sel.<backend>.*` line on the
`selgate.kernels` logger; a fallback reason is logged once per reason in any case.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads with the dispatcher; this module is imported by selgate.kernels itself
    import torch

from selgate import env_vars

log = logging.getLogger("selgate.kernels")

_lock = threading.Lock()
_calls: Counter = Counter()
_launches: Counter = Counter()
_fallbacks: Counter = Counter()
_counters: dict = {}  # device -> int64 tensor [selected tokens, K/V bytes read]
_logged_reasons: set = set()
_capability: dict = {}


def debug_enabled() -> bool:
    return env_vars.current("SELGATE_DEBUG_LOG")


def debug(msg: str) -> None:
    """Log a `sel.*` line when SELGATE_DEBUG_LOG=1 (INFO on `selgate.kernels`)."""
    if debug_enabled():
        if log.getEffectiveLevel() > logging.INFO:
            log.setLevel(logging.INFO)
        if not logging.getLogger().handlers and not log.handlers:
            log.addHandler(logging.StreamHandler())
        log.info(msg)


def device_counter(device: torch.device) -> torch.Tensor:
    """The running `[selected tokens, K/V bytes]` sums of `device` (int64, on that device)."""
    key = str(device)
    with _lock:
        if key not in _counters:
            import torch

            _counters[key] = torch.zeros(2, dtype=torch.int64, device=device)
        return _counters[key]


def record_call(backend: str, norm_ranges: torch.Tensor, bytes_per_key: int, *, counted: bool = False) -> None:
    """Count one call served by `backend`; add its selected tokens and the K/V bytes they
    read unless `counted`: the range normaliser counted them on the device, or the caller
    declared its ranges normal and the call counts them nowhere (no extra launch)."""
    with _lock:
        _calls[backend] += 1
    debugging = debug_enabled()
    if counted and (not debugging or norm_ranges is None):  # None: the kernel counted the caller's ranges
        return
    import torch

    tokens = (norm_ranges[..., 1].to(torch.int64) - norm_ranges[..., 0]).clamp(min=0).sum()
    if not counted:
        device_counter(norm_ranges.device).add_(torch.stack((tokens, tokens * bytes_per_key)))
    if debugging:
        debug(
            f"sel.{backend}.call rows={norm_ranges.shape[:3].numel()} tokens={int(tokens)} kv_bytes={int(tokens) * bytes_per_key}"
        )


def record_launch(kernel: str) -> None:
    """Count one kernel launch (policy tests prove with it that a kernel never ran)."""
    with _lock:
        _launches[kernel] += 1


def record_fallback(backend: str, reason: str, detail: str = "", *, error: bool = False) -> None:
    """Count that `backend` was left for `reason`; log it once per reason (WARNING when a
    kernel raised, INFO for a policy decision) and on every call with SELGATE_DEBUG_LOG=1."""
    key = f"{backend}:{reason}"
    with _lock:
        _fallbacks[key] += 1
        first = key not in _logged_reasons
        _logged_reasons.add(key)
    msg = f"sel.{backend}.fallback reason={reason}" + (f" detail={detail}" if detail else "")
    if first:
        log.log(logging.WARNING if error else logging.INFO, msg)
    elif debug_enabled():
        debug(msg)


def record_capability(cap: str | None, source: str) -> None:
    """Remember the compute capability the policy used and where it came from."""
    if _capability.get("value") == cap and _capability.get("source") == source and not debug_enabled():
        return  # the per-call case: nothing changed, nothing to log
    with _lock:
        changed = _capability.get("value") != cap or _capability.get("source") != source
        _capability.update(value=cap, source=source)
    if changed and source == "override":
        log.info(f"sel.policy.capability value={cap} source=override")
    debug(f"sel.policy.capability value={cap} source={source}")


def served_by() -> dict:
    """Which configuration served this process's launches: the profile files (device, class or
    none, kernels/config.py) and, once a Triton launch was selected, the tuned files
    (kernels/triton/tuning.py). What `stats()`, environment.json and the reports show."""
    import sys

    from . import config

    out = {"profile": config.profile_source()}
    tuning = sys.modules.get("selgate.kernels.triton.tuning")  # never imported (triton) just to say so
    if tuning is not None:
        from selgate.errors import ConfigError

        try:
            status = tuning.tuning_status()
        except ConfigError as e:  # a malformed launch variable: the calls say so; the counters still read
            out["tuned"] = {"served_by": None, "error": str(e)}
        else:
            out["tuned"] = {k: status[k] for k in ("served_by", "path", "files", "autotune", "autotune_s")}
    return out


def stats() -> dict:
    """Counters as plain Python values (reads the device-side sums), and what configuration
    served the launches (`served_by`)."""
    served = served_by()
    with _lock:
        return {
            **served,
            "calls": dict(_calls),
            "launches": dict(_launches),
            "fallback_reasons": dict(_fallbacks),
            "selected_tokens": sum(int(c[0]) for c in _counters.values()),
            "kv_bytes_read": sum(int(c[1]) for c in _counters.values()),
            "capability": _capability.get("value"),
            "capability_source": _capability.get("source"),
        }


def reset_stats() -> None:
    """Zero every counter and forget which fallback reasons were already logged. The device
    sums are zeroed in place on the current stream (kept calls and captured CUDA graphs hold
    them), so a reset belongs outside a graph capture, after the work it should not count."""
    for sums in _counters.values():
        if sums.is_cuda:
            import torch

            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    "reset_stats: the current CUDA stream is capturing a graph, which would record the "
                    "zeroing of the token counters; call it outside the capture"
                )
    with _lock:
        for c in (_calls, _launches, _fallbacks):
            c.clear()
        for sums in _counters.values():  # zeroed in place: kept calls and captured graphs add into them
            sums.zero_()
        _logged_reasons.clear()
        _capability.clear()
