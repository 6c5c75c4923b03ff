"""The packed-SDPA path equals the golden reference, with exact empty rows and autograd."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from selgate.kernels.sdpa import selection_attention_sdpa
from selgate.kernels.sdpa.packed import bucket_lengths
from selgate.reference import selection_attention_ref
from selgate.reference.golden import gather_attention
from selgate.reference.ranges import normalize_ranges
from tests.helpers import random_inputs


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 10_000),
    st.integers(1, 6),
    st.integers(1, 50),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 3, 8]),
    st.integers(1, 5),
    st.booleans(),
)
def test_sdpa_equals_reference_fp64(seed, S, S_kv, G, h, n, with_lse):
    q, k, v, r = random_inputs(B=2, S=S, S_kv=S_kv, G=G, h=h, n=n, seed=seed)
    o_ref, lse_ref = selection_attention_ref(q, k, v, r, return_lse=True)
    out = selection_attention_sdpa(q, k, v, r, return_lse=with_lse)
    o = out[0] if with_lse else out
    assert (o - o_ref).abs().max() <= 1e-12
    empty = torch.isneginf(lse_ref)
    assert torch.equal(o[empty], torch.zeros_like(o[empty]))
    if with_lse:
        assert torch.equal(torch.isneginf(out[1]), empty)
        assert torch.allclose(out[1][~empty], lse_ref[~empty], rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sdpa_low_precision_within_spec(dtype):
    q, k, v, r = random_inputs(B=2, S=7, S_kv=70, G=2, h=4, Dk=16, Dv=16, n=5, dtype=dtype, seed=3)
    o_ref = selection_attention_ref(q, k, v, r)
    err = (selection_attention_sdpa(q, k, v, r).double() - o_ref).abs()
    if dtype == torch.float32:
        assert err.max() <= 1e-5 and err.mean() <= 1e-6
    else:
        norm = normalize_ranges(r, 70)
        plain = gather_attention(q, k, v, norm, scale=16**-0.5, dtype=dtype)[0].double()
        floor = 2 * torch.finfo(dtype).eps * o_ref.abs().max()
        assert err.max() <= 2 * (plain - o_ref).abs().max() + floor and err.mean() <= 1e-3


def test_gradcheck_sdpa():
    q, k, v, r = random_inputs(B=1, S=3, G=2, h=2, Dk=4, Dv=3, S_kv=9, n=3, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: selection_attention_sdpa(q, k, v, r), (q, k, v))


def test_grads_match_reference_with_chunking_and_empty_rows():
    q, k, v, r = random_inputs(S=6, S_kv=40, hi=30, requires_grad=True)
    r[1, 3] = 0
    g_ref = torch.autograd.grad(selection_attention_ref(q, k, v, r).pow(2).sum(), (q, k, v))
    g = torch.autograd.grad(selection_attention_sdpa(q, k, v, r, budget_bytes=1).pow(2).sum(), (q, k, v))
    for a, b in zip(g, g_ref):
        assert (a - b).abs().max() <= 1e-12
    assert torch.equal(g[0][1, 3], torch.zeros_like(g[0][1, 3]))


def test_single_query_attends_to_every_selected_key():
    """The is_causal trap: one query must see all its keys, not only the first."""
    q, k, v, r = random_inputs(B=1, S=1, S_kv=30, G=1, h=2)
    r[:] = torch.tensor([[0, 30]] + [[0, 0]] * 3)
    o = selection_attention_sdpa(q, k, v, r)
    assert not torch.allclose(o[0, 0, 0, 0], v[0, 0, 0].double())
    assert (o - selection_attention_ref(q, k, v, r)).abs().max() <= 1e-12


def test_bucket_lengths():
    L = torch.tensor([0, 1, 16, 17, 64, 65, 1000])
    assert bucket_lengths(L).tolist() == [0, 16, 16, 32, 64, 128, 1024]


def _spy_sdpa(monkeypatch) -> list:
    """Records the (cudnn, flash, efficient, math) SDPA flags in force at each SDPA call."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    b = torch.backends.cuda

    def spy(*args, **kwargs):
        seen.append((b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled()))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return seen


def test_sdpa_never_runs_cudnn_and_keeps_the_callers_choice(monkeypatch):
    """cuDNN attention plans every new shape on the host (90-160 ms a call on the H100), and
    bucket row counts change from call to call: SDPA runs without it, with the other
    backends as the caller left them."""
    seen = _spy_sdpa(monkeypatch)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # the default the packed path must override
    q, k, v, r = random_inputs(B=1, S=4, S_kv=40, G=1, h=2, dtype=torch.float32, seed=5)
    o = selection_attention_sdpa(q, k, v, r)
    assert seen and all(flags == (False, True, True, True) for flags in seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored after the call
    assert (o.double() - selection_attention_ref(q, k, v, r)).abs().max() <= 1e-5
    seen.clear()
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        selection_attention_sdpa(q, k, v, r)
    assert seen and all(flags == (False, False, False, True) for flags in seen)


def test_gradients_take_the_explicit_softmax(monkeypatch):
    """SDPA's memory-efficient backward is not bitwise deterministic (dq differed in every
    repeat on the H100): with gradients no bucket goes through SDPA."""
    seen = _spy_sdpa(monkeypatch)
    q, k, v, r = random_inputs(B=1, S=4, S_kv=40, G=1, h=2, dtype=torch.float32, seed=6, requires_grad=True)
    selection_attention_sdpa(q, k, v, r).sum().backward()
    assert seen == [] and q.grad is not None
    with torch.no_grad():
        selection_attention_sdpa(q, k, v, r)
    assert seen


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU determinism needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_backward_is_bitwise_deterministic_on_the_gpu(dtype):
    q, k, v, r = (t.cuda() for t in random_inputs(B=2, S=8, S_kv=300, G=2, h=4, Dk=64, Dv=64, n=6, dtype=dtype, seed=7))
    grads = []
    for _ in range(10):
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        o = selection_attention_sdpa(qq, kk, vv, r)
        grads.append(torch.autograd.grad(o.float().square().sum(), (qq, kk, vv)))
    for g in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(g, grads[0]))
