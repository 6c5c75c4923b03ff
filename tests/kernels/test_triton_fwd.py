"""The Triton forward against the fp64 golden reference, strict (a fallback can never
answer for the kernel). Outputs are NaN-poisoned before the launch, and every key that no
row of its (b, g) selects is NaN, so a missing store or an out-of-selection read fails.
On CPU this runs under TRITON_INTERPRET=1 on tiny shapes."""

from __future__ import annotations

import os

import pytest
import torch

from selgate.reference import normalize_ranges, resolve_scale
from selgate.reference.varlen import pack_sequences, varlen_to_batched
from tests.helpers import assert_matches_reference, poison_unselected, random_inputs

ON_GPU = torch.cuda.is_available()
if not ON_GPU and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1", allow_module_level=True)

from selgate.kernels import selection_attention, selection_attention_varlen, stats, reset_stats  # noqa: E402
from selgate.kernels.triton import selection_attention_triton  # noqa: E402
from selgate.kernels.triton.fwd import tma_supported, triton_forward  # noqa: E402

DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = [
    torch.float32,
    torch.float16,
    pytest.param(
        torch.bfloat16,
        marks=pytest.mark.skipif(not ON_GPU, reason="the Triton interpreter computes bf16 wrongly (triton-lang/triton#11584)"),
    ),
]
# (B, S, G, h, Dk, Dv, S_kv, n): decode, prefill with Dk=8 and h=16, h=1 with S > S_kv rows
SHAPES = {
    "decode": (3, 1, 2, 4, 16, 32, 70, 4),
    "prefill_dk8_h16": (1, 6, 2, 16, 8, 24, 40, 3),
    "h1_short_kv": (2, 7, 1, 1, 32, 8, 5, 2),
}


def _inputs(shape, dtype, seed):
    B, S, G, h, Dk, Dv, S_kv, n = shape
    q, k, v, ranges = random_inputs(B=B, S=S, G=G, h=h, Dk=Dk, Dv=Dv, S_kv=S_kv, n=n, dtype=dtype, seed=seed)
    ranges[0, 0, 0] = 0  # one row of padding only: L == 0
    return (t.to(DEVICE) for t in (q, k, v, ranges))


# Whole 32-key tiles through tensor descriptors, 16-key gather tiles for the remainders.
TMA_CONFIG = {"BLOCK_L": 32, "num_warps": 4, "num_stages": 1 if DEVICE == "cpu" else 2, "TMA": True, "TAIL_L": 16}


def _poisoned(q, k, v, norm, path: str):
    """K/V with every key no row selects NaN, NaN-filled (o, lse), and the launch config of
    `path` ("gather": the profile's; "tma": TMA_CONFIG, skipped where descriptors cannot run)."""
    o = torch.full((*q.shape[:4], v.shape[-1]), float("nan"), dtype=v.dtype, device=DEVICE)
    lse = torch.full(q.shape[:4], float("nan"), dtype=torch.float32, device=DEVICE)
    cfg = TMA_CONFIG if path == "tma" else None
    if cfg is not None and not tma_supported(k, v):
        pytest.skip("tensor descriptors need SM >= 9.0")
    return (*poison_unselected(k, v, norm), (o, lse), cfg)


@pytest.mark.parametrize("path", ["gather", "tma"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", SHAPES)
def test_forward_matches_reference(case, dtype, path):
    q, k, v, ranges = _inputs(SHAPES[case], dtype, seed=len(case))
    if path == "tma":
        ranges[..., 1] += 40  # ranges longer than a tile, so whole tiles exist
    norm = normalize_ranges(ranges, k.shape[2])
    k_nan, v_nan, (o, lse), cfg = _poisoned(q, k, v, norm, path)
    triton_forward(q, k_nan, v_nan, norm, scale=resolve_scale(None, q.shape[-1]), out=(o, lse), config=cfg)
    assert_matches_reference(q, k, v, norm, o, lse)  # the reference pads gathers with key 0: clean K/V


@pytest.mark.parametrize("path", ["gather", "tma"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", SHAPES)
def test_raw_ranges_clipped_in_the_kernel_match_reference(case, dtype, path):
    """`clip=True` on ranges as a caller gives them (overlapping, duplicated, out of order,
    negative, past the end): each key of the union counts once, and the call's tokens and
    K/V bytes are counted as the normaliser counts them."""
    q, k, v, ranges = _inputs(SHAPES[case], dtype, seed=11 + len(case))
    ranges[..., 1] += 12 if path == "gather" else 45  # long enough to overlap (and fill tiles)
    ranges[..., -1, :] = ranges[..., 0, :]  # a duplicate
    norm = normalize_ranges(ranges, k.shape[2])
    k_nan, v_nan, (o, lse), cfg = _poisoned(q, k, v, norm, path)
    counter = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    scale = resolve_scale(None, q.shape[-1])
    triton_forward(q, k_nan, v_nan, ranges, scale=scale, out=(o, lse), config=cfg, clip=True, counter=counter, kv_bytes_per_key=6)
    assert_matches_reference(q, k, v, norm, o, lse)
    tokens = int((norm[..., 1] - norm[..., 0]).sum())
    assert counter.tolist() == [tokens, 6 * tokens]


def test_int64_ranges_beyond_int32_are_clamped_before_narrowing():
    """With `clip`, int64 values past 2^31 (an "up to the end" marker) or below -2^31 select
    what their clamped values select, not what their low 32 bits would."""
    q, k, v, _ = _inputs(SHAPES["decode"], torch.float32, seed=5)
    S_kv = k.shape[2]
    rows = [[0, 2**63 - 1], [0, 2**32 + 64], [-(2**32) + 5, 10], [3, 2**31]]
    ranges = torch.tensor(rows, dtype=torch.int64, device=DEVICE).expand(*q.shape[:3], 4, 2).contiguous()
    ranges[0, 0, 0] = torch.tensor([[2**32 + 3, 2**32 + 9], [-(2**40), 2**32 + 2], [0, 0], [0, 0]])  # empty, and [0, S_kv)
    norm = normalize_ranges(ranges, S_kv)
    k_nan, v_nan, (o, lse), _ = _poisoned(q, k, v, norm, "gather")
    counter = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    triton_forward(q, k_nan, v_nan, ranges, scale=resolve_scale(None, q.shape[-1]), out=(o, lse), clip=True, counter=counter)
    assert_matches_reference(q, k, v, norm, o, lse)
    assert counter[0].item() == int((norm[..., 1] - norm[..., 0]).sum())


@pytest.mark.parametrize("dtype", DTYPES)
def test_overlapping_raw_ranges_through_strict_dispatcher(dtype):
    """Raw ranges with overlaps, duplicates and out-of-bounds ends count each key once."""
    q, k, v, _ = _inputs(SHAPES["decode"], dtype, seed=3)
    S_kv = k.shape[2]
    ranges = torch.tensor([[0, 20], [10, 30], [10, 30], [S_kv - 5, S_kv + 9]], device=DEVICE)
    ranges = ranges.expand(*q.shape[:3], 4, 2).contiguous()
    reset_stats()
    o, lse = selection_attention(q, k, v, ranges, backend="triton", strict=True, return_lse=True)
    assert stats()["calls"] == {"triton": 1} and stats()["launches"] == {"triton_fwd": 1}
    assert_matches_reference(q, k, v, normalize_ranges(ranges, S_kv), o, lse)


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_matches_per_sequence_reference(dtype):
    """Two packed sequences of different query and key lengths (one decode-like)."""
    g = torch.Generator().manual_seed(7)
    lens_q, lens_k, G, h, D, n = (4, 1), (19, 33), 2, 2, 16, 3
    qs = [torch.randn(1, lq, G, h, D, generator=g) for lq in lens_q]
    ks = [torch.randn(1, G, lk, D, generator=g) for lk in lens_k]
    vs = [torch.randn(1, G, lk, D, generator=g) for lk in lens_k]
    rs = [torch.randint(-2, lk + 3, (1, lq, G, n, 2), generator=g) for lq, lk in zip(lens_q, lens_k)]
    q, cu_q = pack_sequences(qs, dim=1)
    k, cu_k = pack_sequences(ks, dim=2)
    v, _ = pack_sequences(vs, dim=2)
    r, _ = pack_sequences(rs, dim=1)
    q, k, v = (t.to(DEVICE, dtype) for t in (q, k, v))
    r, cu_q, cu_k = r.to(DEVICE), cu_q.to(DEVICE), cu_k.to(DEVICE)
    o, lse = selection_attention_varlen(q, k, v, r, cu_q, cu_k, backend="triton", strict=True, return_lse=True)
    glob, pos = varlen_to_batched(r, cu_q, cu_k)
    assert_matches_reference(q, k, v, glob, o, lse, positions=pos)


def test_explicit_positions_match_reference():
    """Per-query positions (the varlen path's mechanism) mask keys beyond each row's t."""
    q, k, v, ranges = _inputs(SHAPES["prefill_dk8_h16"], torch.float32, seed=11)
    pos = torch.tensor([[3, 39, 0, 17, 17, 8]], device=DEVICE)
    o, lse = selection_attention_triton(q, k, v, ranges, positions=pos, return_lse=True)
    norm = normalize_ranges(ranges, k.shape[2], pos)
    assert_matches_reference(q, k, v, norm, o, lse, positions=pos)
