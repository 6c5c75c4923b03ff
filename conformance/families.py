"""The check of every conformance family, as plain functions `check(impl, case, device)`
that raise `ConformanceFailure`. The test modules parametrize them over the matrix; the
harness self-test calls them directly on known-bad implementations.

Every comparison is against the fp64 golden result (`selection_attention_ref`, gather
formulation) on fresh inputs made from the case, in the precision the implementation is
judged in (`Impl.judged_as`: the case's dtype, or tf32 for a kernel declaring TF32 matmuls);
fp16/bf16/tf32 bounds scale with a plain PyTorch run in that precision
(`gather_attention(..., dtype=...)`, grads by autograd).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch
from torch.autograd.gradcheck import GradcheckError

from selgate.reference import normalize_ranges, query_positions, selected_keys, selected_lengths, selection_attention_ref
from selgate.reference.golden import gather_attention
from selgate.reference.validation import resolve_scale

from .cases import Case, make_inputs
from .compare import ConformanceFailure, assert_close, assert_equal, fail
from .inputs import Inputs
from .poison import poison_cuda_cache
from .registry import Impl, skip_reason
from .tolerances import Precision

POISON_TAIL = 3  # keys appended beyond every query's position, all NaN (bounds family)


@dataclass
class Result:
    """Outputs of one evaluation: `o`, `lse` (None when not declared), grads (dq, dk, dv) or None."""

    o: torch.Tensor
    lse: Optional[torch.Tensor]
    grads: Optional[tuple]


# --- evaluation -------------------------------------------------------------------------------


def _leaves(tensors):
    """Leaf copies that keep each tensor's strides and offset and the storage it shares with the
    others (K and V rows in one buffer stay in one buffer): a gradient run sees the layout a
    forward run sees (a clone would make non-dense views contiguous)."""
    copies = {}
    out = []
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() not in copies:  # one copy per storage, however many tensors view it
            copies[storage.data_ptr()] = storage.clone()
        copy = copies[storage.data_ptr()]
        out.append(
            torch.empty(0, dtype=t.dtype, device=t.device).set_(copy, t.storage_offset(), t.shape, t.stride()).requires_grad_()
        )
    return out


def evaluate(fn, q, k, v, upstream=None) -> Result:
    """`fn(q, k, v) -> (o, lse)`, with `upstream = (do, dlse)` on fresh leaves (`_leaves`) and
    also the gradients of `o . do + lse . dlse` (dlse is zero on rows whose golden lse is -inf),
    all copied out of whatever buffers the implementation returned. On CUDA, the memory the
    outputs will take is poisoned first (`poison_cuda_cache`)."""
    grad = upstream is not None
    leaves = _leaves((q, k, v)) if grad else (q, k, v)
    poison_cuda_cache(q, k, v)
    with torch.set_grad_enabled(grad):
        o, lse = fn(*leaves)
    grads = None
    if grad:
        if not o.requires_grad:
            raise ConformanceFailure("o does not require grad although q, k and v do: loss.backward() would raise")
        do, dlse = upstream
        outs, gos = [o], [do.to(o.dtype)]
        if lse is not None and lse.requires_grad:
            outs.append(lse)
            gos.append(dlse.to(lse.dtype))
        poison_cuda_cache(q, k, v)
        got = torch.autograd.grad(outs, leaves, gos, allow_unused=True)
        grads = tuple(torch.zeros_like(x) if g is None else g.clone() for g, x in zip(got, leaves))
    # copies: a kernel may hand back one buffer on every call (as a CUDA-graph kernel does),
    # which the next call would overwrite before a determinism check compares the two
    return Result(o.detach().clone(), None if lse is None else lse.detach().clone(), grads)


def golden_fn(ranges, scale):
    return lambda q, k, v: selection_attention_ref(q.double(), k.double(), v.double(), ranges, scale=scale, return_lse=True)


def plain_fn(ranges, scale, judged: Precision):
    """The plain PyTorch run in the precision `judged` the fp16/bf16/tf32 bounds scale with:
    inputs rounded to it (`Precision.round`), computed in its dtype."""

    def run(q, k, v):
        norm = normalize_ranges(ranges, k.shape[2])
        q, k, v = (judged.round(t) for t in (q, k, v))
        return gather_attention(q, k, v, norm, scale=resolve_scale(scale, q.shape[-1]), dtype=judged.dtype)

    return run


def impl_fn(impl: Impl, ranges, scale, want_lse=True):
    return lambda q, k, v: impl.forward(q, k, v, ranges, scale=scale, want_lse=want_lse)


def make_upstream(o_ref: torch.Tensor, lse_ref: torch.Tensor, seed: int):
    """Random output gradients (fp64); zero lse gradient where the golden lse is -inf."""
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    do = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64).to(o_ref.device)
    dlse = torch.randn(lse_ref.shape, generator=gen, dtype=torch.float64).to(o_ref.device)
    return do, torch.where(torch.isfinite(lse_ref), dlse, 0.0)


def reference_run(fn, inp: Inputs, case: Case, judged: Precision, grads: bool, lse: bool = True):
    """Golden and (where the bound of `judged` scales with one) plain results of `fn(kind)`
    runs, with the upstream used; the plain run, backward included, computes with the matmuls
    of `judged` (TF32 for tf32). The golden run takes fp64 copies of q, k, v, so its gradients
    stay fp64. Without `lse` (an implementation that returns o alone) the upstream lse
    gradient is zero."""
    qkv64 = [t.double() for t in (inp.q, inp.k, inp.v)]
    gold = evaluate(fn("golden"), *qkv64)
    upstream = make_upstream(gold.o, gold.lse, case.seed) if grads else None
    if upstream is not None and not lse:
        upstream = (upstream[0], torch.zeros_like(upstream[1]))
    if grads:
        gold = evaluate(fn("golden"), *qkv64, upstream)
    plain = None
    if judged.plain_scaled:
        with judged.matmuls():
            plain = evaluate(fn("plain"), inp.q, inp.k, inp.v, upstream)
    return gold, plain, upstream


def _batched(inp: Inputs, judged: Precision, ranges=None):
    r = inp.ranges if ranges is None else ranges
    return lambda kind: golden_fn(r, inp.scale) if kind == "golden" else plain_fn(r, inp.scale, judged)


def compare(case: Case, judged: Precision, got: Result, gold: Result, plain: Optional[Result]) -> None:
    """Every tensor `got` has (o, lse, grads) within its SPEC.md bound in `judged` of the golden one."""
    cid = case.id
    assert_close("o", got.o, gold.o, precision=judged, case_id=cid, plain=None if plain is None else plain.o)
    if got.lse is not None:
        assert_close("lse", got.lse, gold.lse, precision=judged, case_id=cid, plain=None if plain is None else plain.lse)
    if got.grads is not None:
        for i, name in enumerate(("dq", "dk", "dv")):
            assert_close(
                name, got.grads[i], gold.grads[i], precision=judged, case_id=cid, plain=None if plain is None else plain.grads[i]
            )


def _empty_rows(ranges: torch.Tensor, S_kv: int) -> torch.Tensor:
    return selected_lengths(normalize_ranges(ranges, S_kv)) == 0  # [B, S, G]


# --- the families -----------------------------------------------------------------------------


def check_parity(impl: Impl, case: Case, device) -> None:
    """o and lse equal the golden result; an implementation with an o-only path runs it too."""
    inp = make_inputs(case, device)
    judged = impl.judged_as(case.dtype)
    gold, plain, _ = reference_run(_batched(inp, judged), inp, case, judged, grads=False)
    got = evaluate(impl_fn(impl, inp.ranges, inp.scale), inp.q, inp.k, inp.v)
    compare(case, judged, got, gold, plain)
    if impl.lse:
        o_only = evaluate(impl_fn(impl, inp.ranges, inp.scale, want_lse=False), inp.q, inp.k, inp.v)
        assert_close(
            "o", o_only.o, gold.o, precision=judged, case_id=case.id + " (o-only path)", plain=None if plain is None else plain.o
        )


def check_backward(impl: Impl, case: Case, device) -> None:
    """dq, dk, dv equal the golden gradients; keys no row selected get exactly zero dk, dv."""
    inp = make_inputs(case, device)
    judged = impl.judged_as(case.dtype)
    gold, plain, up = reference_run(_batched(inp, judged), inp, case, judged, grads=True, lse=impl.lse)
    got = evaluate(impl_fn(impl, inp.ranges, inp.scale), inp.q, inp.k, inp.v, up)
    compare(case, judged, got, gold, plain)
    unsel = ~selected_keys(inp.ranges, inp.k.shape[2])
    for name, g in (("dk", got.grads[1]), ("dv", got.grads[2])):
        assert_equal(
            f"{name}[unselected keys]",
            g[unsel],
            torch.zeros_like(g[unsel]),
            case_id=case.id,
            why="keys no row selected get exactly zero gradient",
        )


def check_gradcheck(impl: Impl, case: Case, device) -> None:
    """torch.autograd.gradcheck in fp64 (finite differences against the implementation's grads)."""
    inp = make_inputs(case, device)
    leaves = [t.detach().clone().requires_grad_() for t in (inp.q, inp.k, inp.v)]

    def fn(q, k, v):
        o, lse = impl.forward(q, k, v, inp.ranges, scale=inp.scale)
        return (o,) if lse is None else (o, torch.where(torch.isfinite(lse), lse, 0.0))

    try:
        torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-5, rtol=1e-3, nondet_tol=0.0)
    except GradcheckError as e:
        fail(case.id, f"gradcheck: {str(e).splitlines()[0]}")


def check_determinism(impl: Impl, case: Case, device, backward: bool = False) -> None:
    """Repeated runs give bitwise-identical o and lse (and dq, dk, dv with `backward`):
    5 runs on a GPU, where reduction order can race; 2 on CPU, to keep the interpreter cheap."""
    runs = 5 if torch.device(device).type == "cuda" else 2
    inp = make_inputs(case, device)
    up = None
    if backward:
        gold = evaluate(golden_fn(inp.ranges, inp.scale), inp.q, inp.k, inp.v)
        up = make_upstream(gold.o, gold.lse, case.seed)
    fn = impl_fn(impl, inp.ranges, inp.scale)
    first = evaluate(fn, inp.q, inp.k, inp.v, up)
    for i in range(1, runs):
        again = evaluate(fn, inp.q, inp.k, inp.v, up)
        pairs = [("o", again.o, first.o), ("lse", again.lse, first.lse)]
        if up is not None:
            pairs += list(zip(("dq", "dk", "dv"), again.grads, first.grads))
        for name, a, b in pairs:
            if a is not None:
                assert_equal(name, a, b, case_id=case.id, why=f"run {i + 1} vs run 1 must be bitwise identical")


def check_determinism_backward(impl: Impl, case: Case, device) -> None:
    """Repeated forward and backward runs give bitwise-identical o, lse, dq, dk, dv."""
    check_determinism(impl, case, device, backward=True)


def _with_empty_rows(ranges: torch.Tensor, S_kv: int) -> torch.Tensor:
    """Two rows in three made empty: all `(0, 0)` padding, or only inverted ranges and
    ranges wholly beyond `t` (non-canonical empties)."""
    B, S, G, n, _ = ranges.shape
    row = torch.arange(B * S * G, device=ranges.device).reshape(B, S, G, 1, 1)
    t = query_positions(B, S, S_kv, ranges.device)[:, :, None, None]
    j = torch.arange(n, device=ranges.device)
    beyond = torch.stack([t + 1 + j, t + 3 + j], -1)
    inverted = torch.stack([j + 4, j + 1], -1).expand(B, S, G, n, 2)
    odd = torch.where((j % 2 == 0)[..., None], beyond, inverted)
    r = torch.where(row % 3 == 0, 0, torch.where(row % 3 == 1, odd, ranges.to(torch.int64)))
    return r.to(ranges.dtype)


def check_empty_ranges(impl: Impl, case: Case, device) -> None:
    """Rows selecting nothing give o = 0 exactly, lse = -inf, no NaN, and zero dq."""
    inp = make_inputs(case, device)
    S_kv = inp.k.shape[2]
    ranges = _with_empty_rows(inp.ranges, S_kv)
    judged = impl.judged_as(case.dtype)
    gold, plain, up = reference_run(_batched(inp, judged, ranges), inp, case, judged, grads=impl.backward, lse=impl.lse)
    got = evaluate(impl_fn(impl, ranges, inp.scale), inp.q, inp.k, inp.v, up)
    empty = _empty_rows(ranges, S_kv)
    o_e = got.o[empty]
    assert_equal("o[empty rows]", o_e, torch.zeros_like(o_e), case_id=case.id, why="an empty row gives o = 0 exactly")
    if got.lse is not None:
        l_e = got.lse[empty]
        assert_equal(
            "lse[empty rows]", l_e, torch.full_like(l_e, float("-inf")), case_id=case.id, why="an empty row gives lse = -inf"
        )
    if got.grads is not None:
        dq_e = got.grads[0][empty]
        assert_equal(
            "dq[empty rows]", dq_e, torch.zeros_like(dq_e), case_id=case.id, why="an empty row contributes zero gradient"
        )
    compare(case, judged, got, gold, plain)


def _poisoned(inp: Inputs, tail: int):
    """Inputs whose keys no row selects are NaN, plus `tail` NaN keys beyond every query's
    position, reached by `tail` extra queries that select nothing (so `t` of the original
    rows is unchanged) and by an extra range `(t+1, S_kv + tail + 2)` on every original row."""
    q, k, v, r = inp.q, inp.k, inp.v, inp.ranges
    B, S, G, h, Dk = q.shape
    S_kv = k.shape[2]
    unsel = ~selected_keys(r, S_kv)[..., None]
    k = torch.where(unsel, float("nan"), k)
    v = torch.where(unsel, float("nan"), v)
    if not tail:
        return q, k, v, r
    nan = float("nan")
    k = torch.cat([k, k.new_full((B, G, tail, Dk), nan)], 2)
    v = torch.cat([v, v.new_full((B, G, tail, v.shape[3]), nan)], 2)
    q = torch.cat([q, torch.ones_like(q[:, :1]).expand(B, tail, G, h, Dk)], 1)
    t = query_positions(B, S, S_kv, r.device)[:, :, None, None, None]
    past = torch.cat([t + 1, torch.full_like(t, S_kv + tail + 2)], -1).expand(B, S, G, 1, 2)
    r = torch.cat([r.to(torch.int64), past], 3)
    r = torch.cat([r, torch.zeros_like(r[:, :1]).expand(B, tail, G, r.shape[3], 2)], 1)
    return q, k, v, r.to(inp.ranges.dtype)


def check_bounds(impl: Impl, case: Case, device) -> None:
    """Keys outside every selection and beyond `t` hold NaN: any read of them shows up, in
    the output or the gradients. Outputs are poisoned before the call (CUDA caching
    allocator); every element must be finite where the golden result is."""
    inp = make_inputs(case, device)
    S, S_kv = inp.q.shape[1], inp.k.shape[2]
    tail = POISON_TAIL if "prefill" in impl.modes else 0
    judged = impl.judged_as(case.dtype)
    gold, plain, up = reference_run(_batched(inp, judged), inp, case, judged, grads=impl.backward, lse=impl.lse)
    q, k, v, r = _poisoned(inp, tail)
    up_p = None
    if up is not None:
        do, dlse = up
        up_p = (
            torch.cat([do, torch.ones_like(do[:, :1]).expand(-1, tail, -1, -1, -1)], 1),
            torch.cat([dlse, torch.zeros_like(dlse[:, :1]).expand(-1, tail, -1, -1)], 1),
        )
    got = evaluate(impl_fn(impl, r, inp.scale), q, k, v, up_p)
    rows = slice(0, S)
    main = Result(got.o[:, rows], None if got.lse is None else got.lse[:, rows], None)
    if got.grads is not None:
        dq, dk, dv = got.grads
        main.grads = (dq[:, rows], dk[:, :, :S_kv], dv[:, :, :S_kv])
        for name, g in (("dq[tail queries]", dq[:, S:]), ("dk[tail keys]", dk[:, :, S_kv:]), ("dv[tail keys]", dv[:, :, S_kv:])):
            assert_equal(name, g, torch.zeros_like(g), case_id=case.id, why="nothing selects them")
    if tail:
        o_t = got.o[:, S:]
        assert_equal("o[tail queries]", o_t, torch.zeros_like(o_t), case_id=case.id, why="they select nothing")
    compare(case, judged, main, gold, plain)


def check_dtype(impl: Impl, case: Case, device) -> None:
    """Output dtypes, shapes and device of SPEC.md; int32 and int64 ranges give bitwise-equal
    results; non-contiguous q, k, v give correct results, and so do k, v whose rows share one
    buffer (each key's K row then its V row: the storage README recommends for the prefill),
    where the implementation declares those layouts."""
    inp = make_inputs(case, device)
    B, S, G, h, Dk = inp.q.shape
    Dv = inp.v.shape[3]
    judged = impl.judged_as(case.dtype)
    gold, plain, up = reference_run(_batched(inp, judged), inp, case, judged, grads=impl.backward, lse=impl.lse)
    r64, r32 = inp.ranges.to(torch.int64), inp.ranges.to(torch.int32)
    got = evaluate(impl_fn(impl, r64, inp.scale), inp.q, inp.k, inp.v, up)
    want_o = impl.result_dtype or inp.v.dtype
    want_lse = impl.result_dtype or torch.float32
    checks = [("o", got.o, want_o, (B, S, G, h, Dv))]
    if got.lse is not None:
        checks.append(("lse", got.lse, want_lse, (B, S, G, h)))
    if got.grads is not None:
        checks += [(n, g, x.dtype, tuple(x.shape)) for n, g, x in zip(("dq", "dk", "dv"), got.grads, (inp.q, inp.k, inp.v))]
    for name, t, dt, shape in checks:
        if t.dtype != dt or tuple(t.shape) != shape or t.device != inp.q.device:
            fail(case.id, f"{name}: got {t.dtype} {tuple(t.shape)} on {t.device}, expected {dt} {shape} on {inp.q.device}")
    got32 = evaluate(impl_fn(impl, r32, inp.scale), inp.q, inp.k, inp.v, up)
    for name, a, b in [("o", got32.o, got.o), ("lse", got32.lse, got.lse)] + (
        list(zip(("dq", "dk", "dv"), got32.grads, got.grads)) if up is not None else []
    ):
        if a is not None:
            assert_equal(name, a, b, case_id=case.id, why="int32 ranges vs int64 ranges")
    if "strided" in impl.layouts:
        strided = [t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in (inp.q, inp.k, inp.v)]
        compare(case, judged, evaluate(impl_fn(impl, r64, inp.scale), *strided, up), gold, plain)
    if "kv_shared" in impl.layouts:
        kv = torch.empty(*inp.k.shape[:3], Dk + Dv, dtype=inp.k.dtype, device=inp.k.device)
        packed = (inp.q, kv[..., :Dk].copy_(inp.k), kv[..., Dk:].copy_(inp.v))
        compare(case, judged, evaluate(impl_fn(impl, r64, inp.scale), *packed, up), gold, plain)


def check_decode(impl: Impl, case: Case, device) -> None:
    """Decode of query `s` (keys cut at its position `t`) equals row `s` of prefill: for the
    first, middle and last rows, each against the golden row and against the prefill row."""
    inp = make_inputs(case, device)
    S, S_kv = inp.q.shape[1], inp.k.shape[2]
    judged = impl.judged_as(case.dtype)
    gold, plain, _ = reference_run(_batched(inp, judged), inp, case, judged, grads=False)
    prefill = gold
    if "prefill" in impl.modes:
        prefill = evaluate(impl_fn(impl, inp.ranges, inp.scale), inp.q, inp.k, inp.v)
    for s in sorted({0, S // 2, S - 1}):
        t = s + S_kv - S
        if t < 0:
            continue
        row = slice(s, s + 1)
        dec = evaluate(impl_fn(impl, inp.ranges[:, row], inp.scale), inp.q[:, row], inp.k[:, :, : t + 1], inp.v[:, :, : t + 1])
        for name, ref in (("golden", gold), ("prefill", prefill)):
            cid = f"{case.id} decode of row {s} vs {name} row"
            assert_close(
                "o", dec.o, ref.o[:, row], precision=judged, case_id=cid, plain=None if plain is None else plain.o[:, row]
            )
            if dec.lse is not None and ref.lse is not None:
                assert_close(
                    "lse",
                    dec.lse,
                    ref.lse[:, row],
                    precision=judged,
                    case_id=cid,
                    plain=None if plain is None else plain.lse[:, row],
                )


def check_group(impl: Impl, case: Case, device) -> None:
    """With equal q across the heads of a group, every head's o and lse are equal (heads
    share their group's ranges by construction), and correct. Equal up to 4 ulp of the
    largest value: a library matmul may round rows of one product differently (seen: the
    fp64 reference on CUDA, heads differing by 5e-17); a head reading other ranges is off by O(1)."""
    inp = make_inputs(case, device)
    inp.q = inp.q[:, :, :, :1].expand_as(inp.q).contiguous()
    judged = impl.judged_as(case.dtype)
    gold, plain, _ = reference_run(_batched(inp, judged), inp, case, judged, grads=False)
    got = evaluate(impl_fn(impl, inp.ranges, inp.scale), inp.q, inp.k, inp.v)
    for name, t in (("o", got.o), ("lse", got.lse)):
        if t is None:
            continue
        first = t[:, :, :, :1].expand_as(t)
        finite = t[torch.isfinite(t)]
        atol = 4 * torch.finfo(t.dtype).eps * float(finite.abs().max()) if finite.numel() else 0.0
        assert_equal(name, t, first, case_id=case.id, why="equal q across a group's heads gives equal outputs", atol=atol)
    compare(case, judged, got, gold, plain)


def _per_sequence(fn_of_ranges, inp: Inputs):
    """`(q, k, v) -> (o, lse)` running each packed sequence as its own batched call."""
    cu_q, cu_k = inp.cu_seqlens_q.tolist(), inp.cu_seqlens_k.tolist()

    def run(q, k, v):
        outs = [
            fn_of_ranges(inp.ranges[:, a:b])(q[:, a:b], k[:, :, c:d], v[:, :, c:d])
            for a, b, c, d in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:])
        ]
        return torch.cat([o for o, _ in outs], 1), torch.cat([lse for _, lse in outs], 1)

    return run


def _poison_unselected_varlen(inp: Inputs) -> Inputs:
    """Packed inputs whose keys no row of their own sequence selects are NaN (keys beyond
    every query's position and the other sequences' keys included)."""
    cu_q, cu_k = inp.cu_seqlens_q.tolist(), inp.cu_seqlens_k.tolist()
    sel = torch.cat([selected_keys(inp.ranges[:, a:b], d - c) for a, b, c, d in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:])], 2)
    unsel = ~sel[..., None]
    return replace(inp, k=torch.where(unsel, float("nan"), inp.k), v=torch.where(unsel, float("nan"), inp.v))


def check_varlen(impl: Impl, case: Case, device) -> None:
    """Packed sequences (cu_seqlens) give what each sequence gives on its own; every key that
    no row of its sequence selects holds NaN, so reading one (from a neighbouring sequence,
    or beyond a query's position) shows up. Outputs are poisoned before the call (CUDA)."""
    inp = _poison_unselected_varlen(make_inputs(case, device))
    judged = impl.judged_as(case.dtype)

    def fn(kind):
        if kind == "golden":
            return _per_sequence(lambda r: golden_fn(r, inp.scale), inp)
        return _per_sequence(lambda r: plain_fn(r, inp.scale, judged), inp)

    gold, plain, up = reference_run(fn, inp, case, judged, grads=impl.backward, lse=impl.lse)
    got = evaluate(
        lambda q, k, v: impl.forward_varlen(q, k, v, inp.ranges, inp.cu_seqlens_q, inp.cu_seqlens_k, scale=inp.scale),
        inp.q,
        inp.k,
        inp.v,
        up,
    )
    compare(case, judged, got, gold, plain)


@dataclass(frozen=True)
class Family:
    """One family: its check, the cases it takes, what it needs from an implementation."""

    name: str
    check: Callable
    applies: Callable[[Case], bool]
    needs_backward: bool = False
    needs_fp64: bool = False
    needs_modes: Optional[tuple] = None

    def skip(self, impl: Impl, case: Optional[Case], device) -> Optional[str]:
        """Why `impl` does not run `case` in this family (registry.skip_reason), or None."""
        return skip_reason(
            impl,
            case,
            device,
            family=self.name,
            needs_backward=self.needs_backward,
            needs_fp64=self.needs_fp64,
            needs_modes=self.needs_modes,
        )


def _batched_lowp(c: Case) -> bool:
    return c.mode != "varlen" and c.dtype != torch.float64 and not c.gpu_only


def _repeatable(c: Case) -> bool:
    """The determinism families take the contention cases too (their reason to exist)."""
    return c.mode != "varlen" and c.dtype != torch.float64 and c.pattern in ("mixed", "builder", "heavy_reuse", "full")


def _tiny_subset(patterns, fp32_only=False):
    """On tiny (CPU) cases, only `patterns` (and fp32 when `fp32_only`); every case otherwise.
    Keeps the CPU run short for the families that run backward several times."""
    return lambda c: (
        _batched_lowp(c)
        and (c.size != "tiny" or (c.pattern in patterns and c.scale is None and (c.dtype == torch.float32 or not fp32_only)))
    )


FAMILIES = {
    f.name: f
    for f in (
        Family("parity", check_parity, _batched_lowp),
        Family(
            "backward",
            check_backward,
            _tiny_subset(("mixed", "builder", "overlapping", "heavy_reuse", "full", "empty", "beyond_t")),
            needs_backward=True,
        ),
        Family("gradcheck", check_gradcheck, lambda c: c.dtype == torch.float64, needs_backward=True, needs_fp64=True),
        Family("determinism", check_determinism, _repeatable),
        Family("determinism_backward", check_determinism_backward, _repeatable, needs_backward=True),
        Family(
            "empty_ranges",
            check_empty_ranges,
            lambda c: _batched_lowp(c) and c.pattern in ("mixed", "builder", "empty", "padding", "full"),
        ),
        Family("bounds", check_bounds, lambda c: _batched_lowp(c) and (c.size != "tiny" or c.dtype == torch.float32 or c.smoke)),
        Family("dtype", check_dtype, lambda c: _tiny_subset(("mixed",))(c) and c.seed in (0, 7)),
        Family(
            "decode",
            check_decode,
            lambda c: c.mode == "prefill" and c.dtype != torch.float64 and not c.gpu_only,
            needs_modes=("decode",),
        ),
        Family("group", check_group, lambda c: _batched_lowp(c) and c.shape.h > 1 and c.pattern in ("mixed", "builder", "full")),
        Family("varlen", check_varlen, lambda c: c.mode == "varlen"),
    )
}


# --- bad input: not per case, per implementation ----------------------------------------------


@dataclass(frozen=True)
class BadInput:
    """One malformed call: `mutate(inp) -> kwargs` of the call; the error must name `arg`."""

    name: str
    arg: str
    mutate: Callable
    varlen: bool = False


def _base(inp):
    return dict(q=inp.q, k=inp.k, v=inp.v, ranges=inp.ranges, scale=inp.scale)


def _with(**changes):
    return lambda inp: {**_base(inp), **{k: f(inp) for k, f in changes.items()}}


BAD_INPUTS = (
    BadInput("q-rank", "q", _with(q=lambda i: i.q[0])),
    BadInput("q-int", "q", _with(q=lambda i: i.q.to(torch.int32))),
    BadInput("k-headdim", "k", _with(k=lambda i: i.k[..., :-1])),
    BadInput("k-dtype", "k", _with(k=lambda i: i.k.to(torch.float64 if i.q.dtype != torch.float64 else torch.float32))),
    BadInput("v-length", "v", _with(v=lambda i: i.v[:, :, :-1])),
    BadInput("ranges-float", "ranges", _with(ranges=lambda i: i.ranges.to(torch.float32))),
    BadInput("ranges-pairs", "ranges", _with(ranges=lambda i: i.ranges[..., :1].contiguous())),
    BadInput("ranges-groups", "ranges", _with(ranges=lambda i: torch.cat([i.ranges, i.ranges[:, :, :1]], 2))),
    BadInput("scale-nan", "scale", _with(scale=lambda i: float("nan"))),
    BadInput("q-meta", "q", _with(q=lambda i: i.q.to("meta"))),
    BadInput(
        "cu_seqlens_q-total",
        "cu_seqlens_q",
        lambda i: {**_base(i), "cu_q": i.cu_seqlens_q[:-1], "cu_k": i.cu_seqlens_k},
        varlen=True,
    ),
    BadInput(
        "cu_seqlens_k-list",
        "cu_seqlens_k",
        lambda i: {**_base(i), "cu_q": i.cu_seqlens_q, "cu_k": i.cu_seqlens_k.tolist()},
        varlen=True,
    ),
)


def check_bad_input(impl: Impl, bad: BadInput, case: Case, device) -> None:
    """The call raises an error whose message names the offending argument."""
    inp = make_inputs(case, device)
    kw = bad.mutate(inp)
    try:
        with torch.no_grad():
            if bad.varlen:
                impl.forward_varlen(kw["q"], kw["k"], kw["v"], kw["ranges"], kw["cu_q"], kw["cu_k"], scale=kw["scale"])
            else:
                impl.forward(kw["q"], kw["k"], kw["v"], kw["ranges"], scale=kw["scale"])
    except Exception as e:  # any error type, as long as it says what was wrong
        if not re.search(rf"(?<![\w.]){re.escape(bad.arg)}(?!\w)", str(e)):
            fail(case.id, f"bad input {bad.name}: {type(e).__name__} does not name {bad.arg!r}: {e}")
        return
    fail(case.id, f"bad input {bad.name}: accepted silently (expected an error naming {bad.arg!r})")
