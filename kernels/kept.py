"""Kept calls: the dispatcher's decision for a call signature, made once and replayed.

Why: a decode loop repeats one call per layer and step with new tensors of the same layout,
and the ladder's Python (checks, policy rungs, launch planning, argument building) cost more
host time than the kernel takes the device. What routes a call and shapes its launch is all
in its signature: the inputs' shapes, strides, dtypes, devices and 16-byte alignment (the
checks, the copies a backend makes, Triton's specialisation), the keyword arguments, and a
capability override in force; the flags and config files are the policy's, which holds the
kept calls (`DispatchPolicy.kept`), so a flag's new text or `reload_settings()` starts afresh.

A call is kept after the ladder served it on its first rung (nothing fell back, so there is
no fallback to count again) on the Triton forward or the CUDA decode kernel, clipping the
caller's ranges or on declared-normal ones (a route that normalises first would count a failed
replay's tokens twice), outside debug logging and range validation. Calls that record
autograd are never kept (the backward is the autograd Function's). A kept call still checks
int64 positions (a value, not a signature), counts the call in `stats()` and records the
capability, as the ladder does; if it raises, or its launch plan is gone, the call takes the
ladder, which decides again."""

from __future__ import annotations

import torch

from selgate.reference.validation import check_positions_fit

from .policy import OVERRIDES
from .stats import record_call, record_capability

_T = torch.Tensor
LIMIT = 256  # kept signatures per policy: a decode loop needs one per layer shape, a test suite many


def signature(q, k, v, ranges, positions, scale, backend, strict, normalized, return_lse):
    """The call's key among kept calls, or None for a call that is never kept (a tensor
    subclass, a call that records autograd, a tensor without strided storage: functorch's
    wrappers, sparse layouts). Keywords the ladder reads for their truth are keyed as bools;
    `scale` by type and value (the ladder refuses some types equal to an accepted float)."""
    if type(q) is not _T or type(k) is not _T or type(v) is not _T or type(ranges) is not _T:
        return None
    if (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled():
        return None
    try:
        pos = None
        if positions is not None:
            if type(positions) is not _T:
                return None
            pos = (positions.shape, positions.stride(), positions.dtype, positions.device, positions.data_ptr() & 15)
        return (
            q.shape, q.stride(), q.dtype, q.device, q.data_ptr() & 15,
            k.shape, k.stride(), k.dtype, k.device, k.data_ptr() & 15,
            v.shape, v.stride(), v.dtype, v.device, v.data_ptr() & 15,
            ranges.shape, ranges.stride(), ranges.dtype, ranges.device, ranges.data_ptr() & 15,
            pos, type(scale), scale, backend, None if strict is None else bool(strict), bool(normalized),
            bool(return_lse), OVERRIDES[-1] if OVERRIDES else None,
        )  # fmt: skip
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return None


def lookup(kept: dict, key):
    """The kept call of `key`, or None (also for a key holding an unhashable argument)."""
    try:
        return kept.get(key)
    except TypeError:
        return None


def keep(kept: dict, key, backend: str, replay, return_lse: bool, capability: tuple | None) -> None:
    """Keep `replay` (a function of q, k, v, ranges, positions returning `(o, lse)` or None) as
    the call of `key`, served by `backend`; `capability` is the `(value, source)` the ladder
    recorded, if it asked for one."""
    try:
        hash(key)
    except TypeError:  # an unhashable scale or backend: the ladder serves every such call
        return
    if len(kept) >= LIMIT:
        kept.clear()

    def call(q, k, v, ranges, positions):
        if positions is not None:
            check_positions_fit(positions)
        try:
            out = replay(q, k, v, ranges, positions)
        except Exception:  # noqa: BLE001 - the ladder decides again: fallback, strict mode, the error
            kept.pop(key, None)
            return None
        if out is None:
            kept.pop(key, None)
            return None
        if capability is not None:
            record_capability(*capability)
        record_call(backend, None, 0, counted=True)
        return out if return_lse else out[0]

    kept[key] = call
