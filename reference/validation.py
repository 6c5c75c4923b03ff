"""Input validation shared by every entry point.

Every error names the argument, what it got and what was expected, so a caller never
has to read a kernel to learn why a call was refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class Dims:
    """The sizes of one call, read once from validated inputs."""

    B: int
    S: int
    G: int
    h: int
    Dk: int
    S_kv: int
    Dv: int
    n: int


def _need_rank(name: str, t: torch.Tensor, layout: str) -> None:
    rank = layout.count(",") + 1
    if t.dim() != rank:
        raise ValueError(f"{name}: expected a {rank}-D tensor {layout}, got shape {tuple(t.shape)}")


def _need_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")


def _need_data(name: str, t: torch.Tensor) -> None:
    if t.is_meta:
        raise ValueError(f"{name}: a meta tensor {tuple(t.shape)} holds no data; expected a CPU or CUDA tensor")


def check_positions_fit(positions: torch.Tensor) -> None:
    """Every backend computes the key bound `t + 1` in int64, which wraps for t = 2^63 - 1 and
    would turn the row silently empty. int32 positions cannot wrap; int64 ones cost a host read,
    skipped while a CUDA stream is capturing (the eager warm-up call before a capture checks)."""
    if positions.dtype != torch.int64 or positions.numel() == 0:
        return
    if positions.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    top = int(positions.max())
    if top == torch.iinfo(torch.int64).max:
        raise ValueError(f"positions: max {top} = 2^63 - 1 overflows t + 1 in int64; expected t < 2^63 - 1")


_accepted: dict = {}  # (shapes, dtypes, devices) of q, k, v, ranges a check accepted -> their Dims


def check_inputs(q, k, v, ranges, *, scale=None, positions=None) -> Dims:
    """Validate shapes, dtypes and devices of a selection-attention call; return its dims.

    What q, k, v and ranges are checked for depends on their shapes, dtypes and devices alone,
    so a signature accepted once is a dictionary lookup after (a decode loop repeats one)."""
    try:
        key = (q.shape, k.shape, v.shape, ranges.shape, q.dtype, k.dtype, v.dtype, ranges.dtype)
        key += (q.device, k.device, v.device, ranges.device)
    except AttributeError:  # not tensors: the full check names the argument
        key = None
    exact = type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor and type(ranges) is torch.Tensor
    d = _accepted.get(key) if exact else None
    if d is None:
        d = _check_tensors(q, k, v, ranges)
        if exact and len(_accepted) < 4096:
            _accepted[key] = d
    if scale is not None:
        check_scale(scale)
    if positions is not None:
        _need_tensor("positions", positions)
        _need_data("positions", positions)
        if positions.dtype not in INDEX_DTYPES:
            raise TypeError(f"positions: expected int32 or int64, got {positions.dtype}")
        if tuple(positions.shape) != (d.B, d.S):
            raise ValueError(f"positions: expected shape [B={d.B}, S={d.S}], got {tuple(positions.shape)}")
        if positions.device != q.device:
            raise ValueError(f"positions: on {positions.device}, but q is on {q.device}")
        check_positions_fit(positions)
    return d


def _check_tensors(q, k, v, ranges) -> Dims:
    for name, t in (("q", q), ("k", k), ("v", v), ("ranges", ranges)):
        _need_tensor(name, t)
        _need_data(name, t)
    _need_rank("q", q, "[B, S, G, h, Dk]")
    _need_rank("k", k, "[B, G, S_kv, Dk]")
    _need_rank("v", v, "[B, G, S_kv, Dv]")
    _need_rank("ranges", ranges, "[B, S, G, n, 2]")
    if q.dtype not in FLOAT_DTYPES:
        raise TypeError(f"q: expected one of fp16, bf16, fp32, fp64, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: dtype {t.dtype} differs from q's {q.dtype}; q, k and v must share one dtype")
    if ranges.dtype not in INDEX_DTYPES:
        raise TypeError(f"ranges: expected int32 or int64, got {ranges.dtype}")
    for name, t in (("k", k), ("v", v), ("ranges", ranges)):
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device}, but q is on {q.device}; all inputs must share one device")
    B, S, G, h, Dk = q.shape
    _, _, S_kv, _ = k.shape
    Dv = v.shape[3]
    if k.shape[0] != B or k.shape[1] != G:
        raise ValueError(f"k: expected [B={B}, G={G}, S_kv, Dk] to match q {tuple(q.shape)}, got {tuple(k.shape)}")
    if k.shape[3] != Dk:
        raise ValueError(f"k: head dim {k.shape[3]} differs from q's Dk={Dk} (q {tuple(q.shape)}, k {tuple(k.shape)})")
    if tuple(v.shape[:3]) != (B, G, S_kv):
        raise ValueError(f"v: expected [B={B}, G={G}, S_kv={S_kv}, Dv] to match k {tuple(k.shape)}, got {tuple(v.shape)}")
    if ranges.shape[-1] != 2:
        raise ValueError(f"ranges: trailing dimension must be 2 (start, end), got shape {tuple(ranges.shape)}")
    if tuple(ranges.shape[:3]) != (B, S, G):
        raise ValueError(f"ranges: expected [B={B}, S={S}, G={G}, n, 2] to match q, got {tuple(ranges.shape)}")
    if min(B, S, G, h, Dk, Dv) < 1:
        raise ValueError(f"q/v: every dimension must be >= 1, got q {tuple(q.shape)}, v {tuple(v.shape)}")
    return Dims(B=B, S=S, G=G, h=h, Dk=Dk, S_kv=S_kv, Dv=Dv, n=ranges.shape[3])


def check_scale(scale) -> None:
    """SPEC.md's bad input: a scale that is not a finite positive Python number (0 flattens
    every softmax, a negative one inverts it, NaN or inf poisons it)."""
    if isinstance(scale, torch.Tensor) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale: expected a Python float, got {type(scale).__name__}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale: expected a finite float > 0, got {scale}")


def resolve_scale(scale, Dk: int) -> float:
    """The softmax scale of SPEC.md: 1/sqrt(Dk) unless the caller passes one (checked, so no
    path that resolves a scale without `check_inputs` computes with a bad one)."""
    if scale is None:
        return 1.0 / math.sqrt(Dk)
    check_scale(scale)
    return float(scale)
