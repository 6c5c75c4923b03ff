"""Family dtype: output dtypes, shapes and device; int32 and int64 ranges; strided, offset and shared-buffer inputs."""

from __future__ import annotations

from pathlib import Path

import torch

from ..cases import Case, make_inputs
from ..compare import assert_equal, fail, shape_kind
from ..evaluation import batched, compare, evaluate, impl_fn, reference_run
from ..family import Family, tiny_subset
from ..impl import Impl


def in_larger_buffer(t: torch.Tensor, fill) -> torch.Tensor:
    """`t` as a view into a larger allocation filled with `fill`: one extra index before it on
    every dim (a storage offset, as `cache[1:]` has) and padded row strides (non-contiguous,
    innermost stride 1). A kernel that reads from the storage's start, or from rows at their
    dense strides, reads `fill`."""
    buf = torch.full([d + 1 for d in t.shape[:-1]] + [t.shape[-1] + 3], fill, dtype=t.dtype, device=t.device)
    view = buf[(slice(1, None),) * (t.dim() - 1) + (slice(2, 2 + t.shape[-1]),)]
    return view.copy_(t)


FAR = 2**31  # elements between two batches' K/V in `far_apart`: an offset computed in int32 wraps there


def far_apart(k: torch.Tensor, v: torch.Tensor) -> tuple:
    """k and v [B, G, S_kv, D] as views into one buffer, NaN elsewhere, whose batches lie FAR
    elements apart (batch stride 2^31: every batch after the first starts past int32's range), as
    a long context's offsets do (SPEC.md: T * heads * D > 2^31). A kernel that computes
    `b * stride` in int32 reads NaN or another batch's keys. The buffer is (B - 1) * 2^31
    elements plus one batch, 4 GiB at two bytes for B = 2, allocated, never copied."""
    B = k.shape[0]
    one = k[0].numel() + v[0].numel()
    buf = torch.full(((B - 1) * FAR + one,), float("nan"), dtype=k.dtype, device=k.device)
    views = []
    for t, start in ((k, 0), (v, k[0].numel())):
        view = buf.as_strided(t.shape, (FAR, *t[0].contiguous().stride()), start)
        views.append(view.copy_(t))
    return tuple(views)


def far_lock(device):
    """One worker at a time, per GPU, holds a `far_apart` buffer: the workers of a lane share a
    GPU at about 10 GB each, and several 4 GiB buffers at once ran an H100 out of memory."""
    import tempfile

    from filelock import FileLock

    device = torch.device(device)
    # the card, whatever CUDA_VISIBLE_DEVICES numbers it in this process
    card = torch.cuda.get_device_properties(device.index or 0).uuid if device.type == "cuda" else device.type
    return FileLock(Path(tempfile.gettempdir()) / f"selgate-far-apart-{card}.lock")


def far_applies(impl: Impl, case: Case, device) -> bool:
    """A few cases per implementation and low-precision dtype on a GPU: two batches (a batch
    beyond the first; B = 4 would take 12 GiB, which ran an H100 lane's worker out of memory),
    the strided layout declared, mixed ranges."""
    return (
        torch.device(device).type == "cuda"
        and "strided" in impl.layouts
        and case.shape.B == 2
        and case.dtype.itemsize == 2
        and case.pattern == "mixed"
    )


def check(impl: Impl, case: Case, device) -> None:
    """Output dtypes, shapes and device of SPEC.md; int32 and int64 ranges give bitwise-equal
    results; non-contiguous q, k, v give correct results, and so do q, k, v and ranges that are
    views at a storage offset into larger buffers, k and v whose batches lie 2^31 elements apart
    (on a GPU, `far_apart`), and k, v whose rows share one buffer (each key's K row then its V
    row: the storage README recommends for the prefill), where the implementation declares those
    layouts."""
    inp = make_inputs(case, device)
    B, S, G, h, Dk = inp.q.shape
    Dv = inp.v.shape[3]
    judged = impl.judged_as(case.dtype)
    gold, plain, up = reference_run(batched(inp, judged), inp, case, judged, grads=impl.backward, lse=impl.lse)
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
            wrong = [f"wrong dtype (got {t.dtype})"] if t.dtype != dt else []
            wrong += [shape_kind(name, tuple(t.shape), shape)] if tuple(t.shape) != shape else []
            wrong += [f"wrong device (got {t.device.type})"] if t.device != inp.q.device else []
            fail(
                case.id,
                f"{name}: got {t.dtype} {tuple(t.shape)} on {t.device}, expected {dt} {shape} on {inp.q.device}",
                rule="shapes",
                tensor=name,
                kind="; ".join(wrong),
            )
    got32 = evaluate(impl_fn(impl, r32, inp.scale), inp.q, inp.k, inp.v, up)
    for name, a, b in [("o", got32.o, got.o), ("lse", got32.lse, got.lse)] + (
        list(zip(("dq", "dk", "dv"), got32.grads, got.grads)) if up is not None else []
    ):
        if a is not None:
            assert_equal(name, a, b, case_id=case.id, why="int32 ranges vs int64 ranges", rule="ranges")
    if "strided" in impl.layouts:
        strided = [t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in (inp.q, inp.k, inp.v)]
        compare(case, judged, evaluate(impl_fn(impl, r64, inp.scale), *strided, up), gold, plain)
        # around the views: NaN, and (0, 0) ranges (read in place of the real ones, rows go empty)
        offset = [in_larger_buffer(t, float("nan")) for t in (inp.q, inp.k, inp.v)]
        compare(case, judged, evaluate(impl_fn(impl, in_larger_buffer(r64, 0), inp.scale), *offset, up), gold, plain)
    if far_applies(impl, case, device):
        with far_lock(device):
            try:
                # the views are the gradient run's leaves as they are: no second 4 GiB
                got = evaluate(impl_fn(impl, r64, inp.scale), inp.q.clone(), *far_apart(inp.k, inp.v), up, own=True)
                compare(case, judged, got, gold, plain)
            finally:
                torch.cuda.empty_cache()  # the 4 GiB back to the device, for the next worker's turn
    if "kv_shared" in impl.layouts:
        kv = torch.empty(*inp.k.shape[:3], Dk + Dv, dtype=inp.k.dtype, device=inp.k.device)
        packed = (inp.q, kv[..., :Dk].copy_(inp.k), kv[..., Dk:].copy_(inp.v))
        compare(case, judged, evaluate(impl_fn(impl, r64, inp.scale), *packed, up), gold, plain)


FAMILY = Family(
    "dtype",
    "output dtypes, index dtypes, strided and offset inputs",
    rank=7,
    check=check,
    applies=lambda c: tiny_subset(("mixed",))(c) and c.seed in (0, 7),
)
