"""The Gluon pair kernel (kernels/triton/pairs.py): what it accepts, that it compiles for
SM 9.0 on any machine, and on an H100 its output against the fp64 reference, with outputs
NaN-poisoned before the launch and every key no row of its (b, g) selects NaN, over NSA
ranges (the shared tiles) and arbitrary ones, odd S, S < S_kv and S > S_kv (empty rows)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from selgate.bench.inputs import with_kv_layout
from selgate.conformance.inputs import Inputs, random_qkv
from selgate.reference import build_ranges, normalize_ranges, resolve_scale
from tests.helpers import assert_matches_reference, poison_unselected, random_inputs

pairs = pytest.importorskip("selgate.kernels.triton.pairs", reason="needs triton.experimental.gluon")

ON_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
needs_sm90 = pytest.mark.skipif(not ON_SM90, reason="the pair kernel runs on SM 9.x only")


def _qkv(B=1, S=6, G=2, h=4, D=64, S_kv=40, dtype=torch.bfloat16, device="cpu"):
    g = torch.Generator().manual_seed(S * 131 + D)
    return random_qkv(B, S, G, h, D, D, S_kv, dtype=dtype, generator=g, sample_dtype=torch.float32, device=device)


def test_accepts_separate_and_per_key_k_v():
    q, k, v = _qkv(B=2)
    assert pairs.layout_problem(q, k, v, None) is None
    per_key = with_kv_layout(Inputs(q, k, v, None, scale=1.0), "key")
    assert per_key.k.stride(2) == 2 * k.shape[3]
    assert pairs.layout_problem(q, per_key.k, per_key.v, None) is None


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda q, k, v: (q[:, :1], k, v, None), "decode (S=1)"),
        (lambda q, k, v: (q.float(), k.float(), v.float(), None), "dtype"),
        (lambda q, k, v: (q[..., :48], k[..., :48], v[..., :48], None), "Dk=48"),
        (lambda q, k, v: (q, k, v[..., :32], None), "Dv=32"),
        (lambda q, k, v: (torch.cat([q] * 5, 3), k, v, None), "h=20"),
        (lambda q, k, v: (q, k, v, torch.zeros(1, 6, dtype=torch.long)), "positions"),
        (lambda q, k, v: (q, torch.cat([k, k], 2)[:, :, :40], v, None), "k strides"),  # a narrowed cache, G = 2
        (lambda q, k, v: (q, k, torch.cat([v, v], 2)[:, :, :40], None), "v strides"),
        (lambda q, k, v: (q, k.half(), v, None), "dtypes"),
        (
            lambda q, k, v: (torch.cat([q] * 2), torch.cat([k[:, :1]] * 2, 2)[:, :, :40].expand(2, 1, 40, 64), v, None),
            "k strides",
        ),  # B = 2 over a cache twice as long
        (lambda q, k, v: (q, torch.zeros(1, 2, 40, 68, dtype=k.dtype)[..., :64], v, None), "16-byte"),
        (lambda q, k, v: (q, *(torch.empty(1, 2, 2**30, 64, dtype=k.dtype, device="meta"),) * 2, None), "2^31"),
    ],
)
def test_names_what_it_does_not_take(change, needle):
    q, k, v, pos = change(*_qkv())
    assert needle in pairs.layout_problem(q, k, v, pos)


def test_not_taken_off_an_sm90_device():
    assert pairs.unsupported(*_qkv(), None) == "not an SM 9.x device"


def test_a_triton_without_gluon_keeps_the_triton_kernel(monkeypatch):
    """The profile's flag cannot break prefill where `triton.experimental.gluon` is missing."""
    import triton.experimental

    import selgate.kernels.triton as package
    from selgate.kernels.triton import fwd

    monkeypatch.setitem(sys.modules, "triton.experimental.gluon", None)  # importing it raises ImportError
    monkeypatch.delattr(triton.experimental, "gluon")
    monkeypatch.delitem(sys.modules, "selgate.kernels.triton.pairs")
    monkeypatch.delattr(package, "pairs")
    fwd.pair_kernel.cache_clear()
    try:
        assert fwd.pair_kernel() is None
    finally:
        fwd.pair_kernel.cache_clear()


def _compile(dtype: str, D: int) -> None:
    """Compile the kernel for sm_90 (Gluon -> PTX -> cubin) and check its shared memory."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel = pairs._pair_kernel
    gdt = gl.bfloat16 if dtype == "bf16" else gl.float16
    smem = gl.NVMMASharedLayout.get_default_for([1, pairs.BLOCK, D], gdt)
    const = dict(
        H=pairs.HEADS, D=D, N_PAD=16, BL=pairs.BLOCK, STAGES=pairs.STAGES, TAIL=pairs.BLOCK, SMEM=smem, ITEM=2, R=pairs.ROWS
    )
    types = {
        "q_ptr": f"*{dtype}",
        "k_ptr": f"*{dtype}",
        "v_ptr": f"*{dtype}",
        "o_ptr": f"*{dtype}",
        "r_ptr": "*i32",
        "lse_ptr": "*fp32",
        "qk_scale": "fp32",
    }
    sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in kernel.arg_names}
    for n in ("k_desc", "v_desc"):
        sig[n] = f"tensordesc<{dtype}[1,{pairs.BLOCK},{D}],{smem!r}>"
    constexprs = {(kernel.arg_names.index(n),): c for n, c in const.items()}
    src = GluonASTSource(fn=kernel, signature=sig, constexprs=constexprs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": pairs.ROWS})
    assert ".entry _pair_kernel" in compiled.asm["ptx"] and compiled.asm["cubin"]
    assert compiled.metadata.shared <= 228 * 1024 // 3, compiled.metadata.shared  # three programs an SM, as measured


@pytest.mark.parametrize("dtype, D", [("bf16", 128), ("fp16", 64)])
def test_compiles_for_sm90(dtype, D):
    """A build break fails CI, which has no GPU. In a fresh process: under TRITON_INTERPRET=1
    (how CPU CI runs) gluon.jit makes interpreter functions, which cannot be compiled."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = f"from tests.kernels.test_triton_pairs import _compile; _compile({dtype!r}, {D})"
    run = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]


def _nsa_ranges(B, S, G, S_kv, l_sel, n, seed):
    g = torch.Generator().manual_seed(seed)
    return build_ranges(torch.rand(B, S, G, -(-S_kv // l_sel), generator=g), G=G, l_sel=l_sel, n=n, S_kv=S_kv)


# (B, S, G, h, D, S_kv, ranges): NSA ranges of 64- and 32-key blocks (block 0 and the local blocks
# are the shared tiles), an odd S (a program with one row), S < S_kv, S > S_kv (rows with no keys),
# h = 1 and 16, and arbitrary overlapping ranges (no shared tiles, gathered remainders). In "nsa64_long"
# (several ranges a row) most programs take all three kinds of step: shared first-range tiles, each
# row's own tiles, shared last-range tiles.
CASES = {
    "nsa64_long": (2, 67, 2, 16, 128, 1500, ("nsa", 64, 6)),
    "nsa64": (1, 300, 2, 16, 128, 300, ("nsa", 64, 8)),
    "nsa32_odd_S": (2, 129, 1, 4, 64, 200, ("nsa", 32, 6)),
    "nsa64_S_gt_Skv_h1": (1, 160, 2, 1, 128, 130, ("nsa", 64, 4)),
    "random": (1, 97, 2, 8, 64, 333, ("random", 0, 6)),
}


@needs_sm90
@pytest.mark.parametrize("layout", ["separate", "key"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_matches_reference(case, dtype, layout):
    B, S, G, h, D, S_kv, (kind, l_sel, n) = CASES[case]
    q, k, v = _qkv(B, S, G, h, D, S_kv, dtype, "cuda")
    if kind == "nsa":
        ranges = _nsa_ranges(B, S, G, S_kv, l_sel, n, seed=S)
    else:
        ranges = random_inputs(B=B, S=S, G=G, h=1, Dk=8, Dv=8, S_kv=S_kv, n=n, seed=S, hi=S_kv + 60)[3]
    norm = normalize_ranges(ranges.cuda(), S_kv, None).to(torch.int32)
    if S > S_kv:
        assert bool((norm[0, : S - S_kv, :, :, 1] <= norm[0, : S - S_kv, :, :, 0]).all())  # really empty rows
    poisoned = with_kv_layout(Inputs(q, *poison_unselected(k, v, norm), norm, scale=1.0), layout)
    k_nan, v_nan = poisoned.k, poisoned.v
    assert pairs.unsupported(q, k_nan, v_nan, None) is None
    o = torch.full((B, S, G, h, D), float("nan"), dtype=dtype, device="cuda")
    lse = torch.full((B, S, G, h), float("nan"), device="cuda")
    pairs.pair_forward(q, k_nan, v_nan, norm, scale=resolve_scale(None, D), out=(o, lse))
    assert_matches_reference(q, k, v, norm, o, lse)
    again = (torch.empty_like(o), torch.empty_like(lse))
    pairs.pair_forward(q, k_nan, v_nan, norm, scale=resolve_scale(None, D), out=again)
    assert torch.equal(o, again[0]) and torch.equal(lse, again[1])  # bitwise, run to run


@needs_sm90
def test_the_h100_profile_routes_supported_prefill_calls_to_it():
    from selgate.kernels import reset_stats, stats
    from selgate.kernels.triton import tuning
    from selgate.kernels.triton.fwd import triton_forward

    if not tuning.fwd_config(128, 128, 2, "prefill", dtype=torch.bfloat16, S_kv=256, n=4)["PAIRS"]:
        pytest.skip("this device's profile does not turn the pair kernel on")
    q, k, v = _qkv(1, 64, 2, 8, 128, 256, torch.bfloat16, "cuda")
    norm = normalize_ranges(_nsa_ranges(1, 64, 2, 256, 64, 4, seed=1).cuda(), 256, None).to(torch.int32)
    reset_stats()
    o, lse = triton_forward(q, k, v, norm, scale=resolve_scale(None, 128))
    triton_forward(q.float(), k.float(), v.float(), norm, scale=resolve_scale(None, 128))  # fp32: fwd.py
    launches = stats()["launches"]
    assert launches.get("triton_fwd_pairs") == 1 and launches.get("triton_fwd") == 2
    assert_matches_reference(q, k, v, norm, o, lse)
