"""The public entry points and the fallback ladder.

One ladder, walked in this order, each rung leaving the fast path with a reason code
(counted in `stats()`, logged once per reason):
1. explicit `backend=` ("triton", "sdpa", "reference", "cuda"); `auto` continues below;
2. SELGATE_FORCE_PARITY=1: everything goes to the fp64 reference ("reference");
3. device: CPU goes to sdpa ("cpu") and never imports triton, unless TRITON_INTERPRET=1
   and a capability override simulate a GPU (policy tests);
4. dtype, head dims, compute capability and the ADR policy (`policy.triton_unsupported`);
5. gradients: inputs that require grad use the Triton backward; SELGATE_TRITON_ALLOW_GRAD=0 sends them to sdpa ("grad");
6. min-L: max selected length below SELGATE_TRITON_MIN_L goes to sdpa ("min_L"); on a device the
   length is bounded by S_kv instead of read, so no call synchronises;
7. flags: SELGATE_TRITON_ENABLE=0 goes to sdpa ("disabled").
SELGATE_TRITON_FORCE=1 skips the ADR rule, min-L and SELGATE_TRITON_ENABLE. For decode, the
CUDA kernel is tried before Triton when SELGATE_CUDA_ENABLE=1 or `backend="cuda"`. A backend that
raises hands over to the next rung (sdpa last) unless strict mode forbids it, or unless it
is the backend the caller named and the error is a malformed setting (`ConfigError`).
"""

from __future__ import annotations

import torch

from selgate.reference.golden import selection_attention_ref
from selgate.reference.ranges import normalize_ranges, selected_lengths, validate_ranges
from selgate.reference.validation import check_inputs, resolve_scale
from selgate.reference.varlen import varlen_to_batched

from . import kept
from selgate.errors import BackendUnavailable, ConfigError, StrictModeError
from .policy import capability, capability_overridden, capability_source, dispatch_policy, triton_unsupported
from .sdpa import selection_attention_sdpa
from .stats import debug, device_counter, record_call, record_fallback

BACKENDS = ("auto", "triton", "sdpa", "reference", "cuda")


def _normalize(ranges, d, positions, bytes_per_key: int, st):
    """`(normalised ranges, counted)`. CUDA tensors take one Triton launch that also adds
    the call's selected tokens and K/V bytes to the device counters (`counted`); the torch
    formulation's ~30 small ops cost ~1 ms of host time per decode step on the H100 host.
    SELGATE_TRITON_NORMALIZE=0 keeps the torch formulation on CUDA too, and so does an S_kv
    past the launch's packed sort key (MAX_S_KV)."""
    if ranges.is_cuda and st.triton_normalize:
        from .triton.normalize import MAX_S_KV, normalize_ranges_triton

        if d.S_kv <= MAX_S_KV:
            norm = normalize_ranges_triton(
                ranges, d.S_kv, positions, counter=device_counter(ranges.device), kv_bytes_per_key=bytes_per_key
            )
            return norm, True
    return normalize_ranges(ranges, d.S_kv, positions), False


def _run(name: str, q, k, v, norm, scale, positions, d, st, need_lse: bool):
    """Call one backend on normalised ranges; returns `(o, lse)`. Without `need_lse` the
    packed-SDPA path runs SDPA's forward (2-3.9x faster than its explicit softmax on a 2-core
    CPU machine for decode and prefill shapes, 2026-11-24) and `lse` is None."""
    if name == "triton":
        from .triton import run_triton

        return run_triton(q, k, v, norm, scale=resolve_scale(scale, d.Dk), positions=positions, allow_grad=st.allow_grad)
    if name == "cuda":
        try:
            from .cuda.decode import run_cuda
        except ImportError as e:
            raise BackendUnavailable("unavailable", f"selgate.kernels.cuda cannot be imported: {e}") from e
        return run_cuda(q, k, v, norm, d, scale=scale, positions=positions)
    if name == "sdpa":
        out = selection_attention_sdpa(
            q, k, v, norm, scale=scale, positions=positions, return_lse=need_lse, normalized=True, budget_bytes=st.budget_bytes
        )
        return out if need_lse else (out, None)
    o, lse = selection_attention_ref(
        q, k, v, norm, scale=scale, positions=positions, return_lse=True, budget_bytes=st.budget_bytes
    )
    return o.to(v.dtype), lse.to(torch.promote_types(q.dtype, torch.float32))


def _clips(name: str, d) -> bool:
    """Whether backend `name` takes this call's ranges as given, making them disjoint and
    counting their tokens in its own kernel, so a decode call is one launch (no normalising launch)."""
    if name == "triton":
        return True
    if name == "cuda":
        try:
            from .cuda.decode import CLIP_MAX_RANGES
        except ImportError:  # the rung itself names why (`_run`)
            return False
        return d.n <= CLIP_MAX_RANGES
    return False


def _clip_args(device, bytes_per_key: int) -> dict:
    """A clipping backend's keywords: it makes the ranges disjoint and adds the call's tokens
    and K/V bytes to the device's counters."""
    return {"clip": True, "counter": device_counter(device), "kv_bytes_per_key": bytes_per_key}


def _run_fused(name: str, q, k, v, ranges, scale, positions, d, bytes_per_key: int):
    """Backend `name` (one that `_clips`) on the caller's ranges as given."""
    if name == "cuda":
        from .cuda.decode import run_cuda

        return run_cuda(q, k, v, ranges, d, scale=scale, positions=positions, **_clip_args(q.device, bytes_per_key))
    from .triton.fwd import triton_forward

    sc = resolve_scale(scale, d.Dk)
    return triton_forward(q, k, v, ranges, scale=sc, positions=positions, **_clip_args(q.device, bytes_per_key))


def _needs_grad(q, k, v) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def _plan(q, k, v, d, backend: str, st) -> list:
    """Backends to try in order. The Triton rung's own checks run only when the walk
    reaches it, so a call the CUDA kernel serves pays for none of them (min-L's host read)."""
    if backend in ("sdpa", "reference"):
        return [backend]
    chain = []
    if backend == "cuda" or (
        backend == "auto" and st.use_cuda and d.S == 1 and q.device.type == "cuda" and not _needs_grad(q, k, v)
    ):
        chain.append("cuda")
    return chain + ["triton", "sdpa"]


def _triton_skip(q, k, v, d, norm, st, explicit: bool):
    """The first rung that keeps this call off Triton, as `(reason, detail)`, or None.
    An explicit request skips the performance rungs (min-L, SELGATE_TRITON_ENABLE)."""
    if not explicit and q.device.type != "cuda" and not (st.interpret and capability_overridden(st)):
        return "cpu", f"q is on {q.device}; auto uses sdpa there"
    why = triton_unsupported(q, d.Dk, d.Dv, capability(q.device, st), st)
    if why is not None:
        return why
    if not st.allow_grad and _needs_grad(q, k, v):
        return "grad", "inputs require grad and SELGATE_TRITON_ALLOW_GRAD is off"
    if explicit or st.force_triton:
        return None
    if st.min_L > 0:
        # On a device, S_kv bounds L: reading L would synchronise every call (and break CUDA-graph
        # capture). Host tensors (the interpreter) are read exactly.
        L_max = d.S_kv if d.S_kv < st.min_L or norm.is_cuda else int(selected_lengths(norm).max())
        if L_max < st.min_L:
            return "min_L", f"max selected length {L_max} < SELGATE_TRITON_MIN_L={st.min_L}"
    if not st.use_triton:
        return "disabled", "SELGATE_TRITON_ENABLE=0"
    return None


def selection_attention(
    q,
    k,
    v,
    ranges,
    *,
    scale=None,
    backend: str = "auto",
    return_lse: bool = False,
    positions=None,
    strict=None,
    normalized: bool = False,
):
    """NSA selection attention (SPEC.md) through the fallback ladder (module docstring).

    `strict` (default SELGATE_STRICT) turns every departure from the requested backend, or
    from the one the policy chose for `auto`, into `StrictModeError`. `normalized=True` is the
    caller's word that `ranges` already meet the producer contract (sorted by start, merged,
    clamped to `t + 1`, padded with `(0, 0)`: what `selgate.reference.build_ranges` emits): the
    normalising launch is skipped, so a decode call is one kernel launch, and its selected
    tokens are not counted in `stats()` (the normaliser counts them). SELGATE_VALIDATE_RANGES=1
    checks that word on every call. Returns `o`, or `(o, lse)` with `return_lse`."""
    if torch.compiler.is_compiling():  # traced as one op (op.py): no graph break, autograd included
        from .op import selection_attention_op

        o, lse = selection_attention_op(q, k, v, ranges, positions, scale, backend, strict, normalized, return_lse)
        return (o, lse) if return_lse else o
    return eager_selection_attention(q, k, v, ranges, positions, scale, backend, strict, normalized, return_lse)


def eager_selection_attention(q, k, v, ranges, positions, scale, backend, strict, normalized, return_lse):
    """The ladder itself, in Python: every eager call, and the op's implementation (arguments in
    the op's schema order). A signature the ladder served before replays its kept call (kept.py)."""
    st = dispatch_policy()
    key = kept.signature(q, k, v, ranges, positions, scale, backend, strict, normalized, return_lse)
    if key is not None:
        call = kept.lookup(st.kept, key)
        if call is not None:
            out = call(q, k, v, ranges, positions)
            if out is not None:
                return out
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    d = check_inputs(q, k, v, ranges, scale=scale, positions=positions)
    strict = st.strict if strict is None else bool(strict)
    bytes_per_key = (d.Dk + d.Dv) * q.element_size()
    if st.validate:
        validate_ranges(ranges, d.S_kv, positions)
        norm, counted = ranges, False
    elif normalized:
        norm, counted = ranges, True
    elif ranges.is_cuda and st.triton_normalize and not st.debug:
        norm, counted = None, False  # normalised where a backend needs it; the Triton forward clips itself
    else:
        norm, counted = _normalize(ranges, d, positions, bytes_per_key, st)
    if backend == "auto" and st.force_parity:
        backend = "reference"
    chain = _plan(q, k, v, d, backend, st)
    if st.debug:
        debug(f"sel.dispatch.plan backend={backend} chain={'>'.join(chain)} strict={strict}")
    for i, name in enumerate(chain):
        fused = norm is None and not _needs_grad(q, k, v) and _clips(name, d)
        if norm is None and not fused:
            norm, counted = _normalize(ranges, d, positions, bytes_per_key, st)
        if name == "triton":
            skip = _triton_skip(q, k, v, d, ranges if fused else norm, st, explicit=backend in ("triton", "cuda"))
            if skip is not None:
                if strict and backend == "triton":
                    raise StrictModeError(f"backend={backend!r} cannot run: {skip[0]}: {skip[1]}")
                record_fallback("triton", *skip)
                continue
        try:
            if fused:
                o, lse = _run_fused(name, q, k, v, ranges, scale, positions, d, bytes_per_key)
            else:
                o, lse = _run(name, q, k, v, norm, scale, positions, d, st, return_lse)
        except Exception as e:
            if strict:
                raise StrictModeError(f"backend {name!r} failed and strict mode forbids falling back: {e}") from e
            if i == len(chain) - 1 or (isinstance(e, ConfigError) and name == backend):
                raise  # a backend named by the caller never hides its malformed configuration
            reason = e.reason if isinstance(e, BackendUnavailable) else "config" if isinstance(e, ConfigError) else "error"
            record_fallback(name, reason, f"{type(e).__name__}: {e}", error=not isinstance(e, BackendUnavailable))
            continue
        record_call(name, norm, bytes_per_key, counted=counted or fused)
        if (
            key is not None
            and i == 0
            and not (st.debug or st.validate)
            and (fused or normalized)  # a route that normalised first would count a failed replay's tokens twice
            and not _reads_lengths(q, backend, st)
        ):
            replay = _replay(name, q, k, v, ranges, scale, positions, d, bytes_per_key, fused)
            if replay is not None:
                cap = capability_source(q.device, st) if name == "triton" else (None, None)  # as the ladder records it
                kept.keep(st.kept, key, name, replay, return_lse, cap if cap[0] is not None else None)
        return (o, lse) if return_lse else o


def _reads_lengths(q, backend: str, st) -> bool:
    """Whether the min-L rung routed this call by its ranges' values (host tensors: the
    interpreter), which its signature does not hold."""
    return q.device.type != "cuda" and st.min_L > 0 and backend == "auto" and not st.force_triton


def _replay(name, q, k, v, ranges, scale, positions, d, bytes_per_key: int, fused: bool):
    """The call just served, kept for its repeats (kept.py): the Triton forward or the CUDA
    kernel, clipping the caller's ranges (`fused`) or on declared-normal ones; None for any
    other backend."""
    clip = _clip_args(q.device, bytes_per_key) if fused else {}
    if name == "triton":
        from .triton.fwd import forward_replay

        return forward_replay(q, k, v, ranges, scale=resolve_scale(scale, d.Dk), positions=positions, **clip)
    if name == "cuda":
        from .cuda.decode import cuda_replay

        return cuda_replay(q, k, v, d, scale=scale, positions=positions, **clip)
    return None


def selection_attention_varlen(
    q,
    k,
    v,
    ranges,
    cu_seqlens_q,
    cu_seqlens_k,
    *,
    scale=None,
    backend: str = "auto",
    return_lse: bool = False,
    strict=None,
):
    """Packed sequences (FlashAttention's cu_seqlens; layout of `reference/varlen.py`:
    q [1,T_q,G,h,Dk], k/v [1,G,T_kv,D], sequence-local ranges [1,T_q,G,n,2]), served as
    one batched call with per-query positions."""
    for name, t, rank in (("q", q, 5), ("ranges", ranges, 5), ("k", k, 4)):
        if not isinstance(t, torch.Tensor) or t.dim() != rank or t.shape[0] != 1:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: varlen expects a packed {rank}-D tensor with leading dim 1, got {shape}")
    if torch.compiler.is_compiling():  # the offsets' checks read values: traced as one op (op.py)
        from .op import varlen_to_batched_op

        glob, pos = varlen_to_batched_op(ranges, cu_seqlens_q, cu_seqlens_k, k.shape[2])
    else:
        glob, pos = varlen_to_batched(ranges, cu_seqlens_q, cu_seqlens_k, T_kv=k.shape[2])
    return selection_attention(q, k, v, glob, scale=scale, backend=backend, return_lse=return_lse, positions=pos, strict=strict)
