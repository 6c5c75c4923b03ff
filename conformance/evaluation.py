"""How every family runs an implementation and the references: fresh leaves, poisoned output
memory, copies of what comes back, and the comparison in the precision the implementation is
judged in (`Impl.judged_as`: the case's dtype, or tf32 for a kernel declaring TF32 matmuls).

Every comparison is against the fp64 golden result (`selection_attention_ref`, gather
formulation) on fresh inputs made from the case; fp16/bf16/tf32 bounds scale with a plain
PyTorch run in that precision (`gather_attention(..., dtype=...)`, grads by autograd).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from selgate.reference import normalize_ranges, selected_lengths, selection_attention_ref
from selgate.reference.golden import gather_attention
from selgate.reference.validation import resolve_scale

from .cases import Case
from .compare import ConformanceFailure, assert_close, bits
from .inputs import Inputs
from .poison import poison_cuda_cache
from .impl import Impl
from .tolerances import Precision


@dataclass
class Result:
    """Outputs of one evaluation: `o`, `lse` (None when not declared), grads (dq, dk, dv) or None."""

    o: torch.Tensor
    lse: Optional[torch.Tensor]
    grads: Optional[tuple]


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


class Unmodified:
    """Copies of the tensors an implementation is handed; `check()` fails, naming the tensor,
    when a call wrote into one (a kernel that normalises the caller's ranges in place, or
    uses q as scratch, breaks every later call of the caller)."""

    def __init__(self, **tensors):
        self.saved = {name: (t, bits(t.detach()).clone()) for name, t in tensors.items() if t is not None}

    def check(self, when: str = "the call") -> None:
        for name, (t, before) in self.saved.items():
            differ = int((bits(t.detach()) != before).sum())
            if differ:
                raise ConformanceFailure(
                    f"{name}: modified by {when} ({differ} elements differ)",
                    rule="inputs-unchanged",
                    tensor=name,
                    kind=f"modified by {when}",
                )


def evaluate(fn, q, k, v, upstream=None, *, own=False) -> Result:
    """`fn(q, k, v) -> (o, lse)`, with `upstream = (do, dlse)` on fresh leaves (`_leaves`) and
    also the gradients of `o . do + lse . dlse` (dlse is zero on rows whose golden lse is -inf),
    all copied out of whatever buffers the implementation returned. On CUDA, the memory the
    outputs will take is poisoned first (`poison_cuda_cache`). The q, k, v the call saw, and
    what `guarding` names, must come back bit for bit unchanged, after the forward and after
    the backward. `own`: q, k, v were made for this one call, so they are its leaves as they
    are (a 4 GiB `far_apart` buffer is not copied)."""
    grad = upstream is not None
    leaves = (q, k, v)
    if grad:
        leaves = [t.detach().requires_grad_() for t in leaves] if own else _leaves(leaves)
    inputs = Unmodified(q=leaves[0], k=leaves[1], v=leaves[2], **getattr(fn, "unmodified", {}))
    poison_cuda_cache(q, k, v)
    with torch.set_grad_enabled(grad):
        o, lse = fn(*leaves)
    inputs.check()
    grads = None
    if grad:
        if not o.requires_grad:
            raise ConformanceFailure(
                "o does not require grad although q, k and v do: loss.backward() would raise",
                rule="gradients",
                tensor="o",
                kind="does not require grad although q, k and v do",
            )
        do, dlse = upstream
        outs, gos = [o], [do.to(o.dtype)]
        if lse is not None and lse.requires_grad:
            outs.append(lse)
            gos.append(dlse.to(lse.dtype))
        poison_cuda_cache(q, k, v)
        got = torch.autograd.grad(outs, leaves, gos, allow_unused=True)
        inputs.check("the backward")
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


def guarding(fn, **tensors):
    """`fn` marked so that `evaluate` also requires `tensors` (the call's other inputs: ranges,
    cu_seqlens) to come back unchanged."""
    fn.unmodified = tensors
    return fn


def impl_fn(impl: Impl, ranges, scale, want_lse=True):
    """`(q, k, v) -> (o, lse)` of `impl` on `ranges`, which the call must leave unchanged, and
    whose o and lse must come back in SPEC.md's dtypes (v's and fp32, or the declared
    `result_dtype`) on q's device: on every call, since values are compared in fp64 and a dtype
    wrong on one path only (int32 ranges, a fallback) would pass them."""

    def call(q, k, v):
        o, lse = impl.forward(q, k, v, ranges, scale=scale, want_lse=want_lse)
        if lse is None and want_lse and impl.lse:  # else no family would ever judge the lse it declares
            raise ConformanceFailure(
                "lse: declared (lse: true) but the call returned none",
                rule="shapes",
                tensor="lse",
                kind="declared but not returned",
            )
        for name, t, dtype in (("o", o, impl.result_dtype or v.dtype), ("lse", lse, impl.result_dtype or torch.float32)):
            if t is not None and (t.dtype != dtype or t.device != q.device):
                wrong = "wrong dtype" if t.dtype != dtype else "wrong device"
                raise ConformanceFailure(
                    f"{name}: got {t.dtype} on {t.device}, expected {dtype} on {q.device} (SPEC.md, Shapes)",
                    rule="shapes",
                    tensor=name,
                    kind=f"{wrong} (got {t.dtype if t.dtype != dtype else t.device.type})",
                )
        return o, lse

    return guarding(call, ranges=ranges)


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


def batched(inp: Inputs, judged: Precision, ranges=None):
    """The golden and plain runs of a batched (not packed) call on `inp`, with `ranges` if given."""
    r = inp.ranges if ranges is None else ranges
    return lambda kind: golden_fn(r, inp.scale) if kind == "golden" else plain_fn(r, inp.scale, judged)


def compare(case: Case, judged: Precision, got: Result, gold: Result, plain: Optional[Result], grad_values: bool = True) -> None:
    """Every tensor `got` has (o, lse, grads) within its SPEC.md bound in `judged` of the golden one
    (`grad_values` False: the gradients' special values only, `assert_close`'s `values`)."""
    cid = case.id
    assert_close("o", got.o, gold.o, precision=judged, case_id=cid, plain=None if plain is None else plain.o)
    if got.lse is not None:
        assert_close("lse", got.lse, gold.lse, precision=judged, case_id=cid, plain=None if plain is None else plain.lse)
    if got.grads is not None:
        for i, name in enumerate(("dq", "dk", "dv")):
            assert_close(
                name,
                got.grads[i],
                gold.grads[i],
                precision=judged,
                case_id=cid,
                plain=None if plain is None else plain.grads[i],
                values=grad_values,
            )


def empty_rows(ranges: torch.Tensor, S_kv: int) -> torch.Tensor:
    return selected_lengths(normalize_ranges(ranges, S_kv)) == 0  # [B, S, G]
