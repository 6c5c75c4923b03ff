"""The one-launch Triton range normalisation equals the torch reference, bit for bit."""

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton runs on CPU only under TRITON_INTERPRET=1 (bin/test sets it)", allow_module_level=True)

from selgate.conformance.inputs import random_qkv  # noqa: E402
from selgate.kernels.triton.normalize import normalize_ranges_triton  # noqa: E402
from selgate.reference import normalize_ranges  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 10_000),
    st.integers(1, 70),
    st.integers(1, 5),
    st.integers(1, 17),
    st.sampled_from([torch.int32, torch.int64]),
    st.booleans(),
    st.booleans(),
)
def test_equals_reference(seed, S_kv, S, n, dtype, with_pos, strided):
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(-5, S_kv + 8, (2, S, 3, n, 2), generator=g).to(dtype)
    if strided:  # a view whose (start, end) pairs are not contiguous
        r = torch.randint(-5, S_kv + 8, (2, S, 3, n, 3), generator=g).to(dtype)[..., ::2]
    pos = torch.randint(-2, S_kv + 2, (2, S), generator=g) if with_pos else None
    want = normalize_ranges(r, S_kv, pos)
    dev = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    out = torch.full(r.shape, -7, dtype=r.dtype, device=DEVICE)  # poisoned: every element must be written
    got = normalize_ranges_triton(dev(r), S_kv, dev(pos), out=out)
    assert got is out and got.dtype == r.dtype
    assert torch.equal(got.cpu(), want)


def test_many_overlapping_ranges_merge_into_one():
    r = torch.tensor([[i, i + 3] for i in range(0, 32, 2)]).reshape(1, 1, 1, 16, 2)
    got = normalize_ranges_triton(r.to(DEVICE), 40).cpu()
    assert got[0, 0, 0, 0].tolist() == [0, 33] and bool((got[0, 0, 0, 1:] == 0).all())


def test_dispatcher_on_cuda_uses_it(monkeypatch):
    if DEVICE != "cuda":
        pytest.skip("the dispatcher normalises with Triton only for CUDA tensors")
    monkeypatch.setenv("SELGATE_TRITON_NORMALIZE", "1")
    import selgate.kernels.triton.normalize as normalize

    calls = []
    real = normalize.normalize_ranges_triton
    monkeypatch.setattr(normalize, "normalize_ranges_triton", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    from selgate.kernels import selection_attention
    from selgate.reference import selection_attention_ref

    g = torch.Generator().manual_seed(3)
    q, k, v = random_qkv(2, 3, 2, 4, 64, 64, 50, dtype=torch.float32, generator=g, sample_dtype=torch.float32)
    r = torch.randint(-3, 55, (2, 3, 2, 6, 2), generator=g)
    o = selection_attention(q.cuda(), k.cuda(), v.cuda(), r.cuda(), backend="sdpa", strict=True)
    assert calls == [1], "the dispatcher did not normalise with the Triton kernel"
    assert (o.double().cpu() - selection_attention_ref(q, k, v, r)).abs().max() <= 1e-5


def test_counts_selected_tokens_and_bytes_on_the_device():
    g = torch.Generator().manual_seed(11)
    r = torch.randint(-3, 45, (2, 3, 2, 5, 2), generator=g)
    pos = torch.randint(0, 40, (2, 3), generator=g)
    counter = torch.tensor([7, 70], dtype=torch.int64, device=DEVICE)  # a running sum: added to, never reset
    got = normalize_ranges_triton(r.to(DEVICE), 40, pos.to(DEVICE), counter=counter, kv_bytes_per_key=12)
    L = int((got[..., 1] - got[..., 0]).sum())
    assert L == int((normalize_ranges(r, 40, pos)[..., 1] - normalize_ranges(r, 40, pos)[..., 0]).sum()) > 0
    assert counter.tolist() == [7 + L, 70 + 12 * L]


def test_rows_spread_over_programs_with_a_partial_last_one():
    """222 rows at 16 rows a program (n=16): 14 programs, the last with 14 live rows; every row
    written, the count exact."""
    g = torch.Generator().manual_seed(5)
    r = torch.randint(-4, 90, (3, 37, 2, 16, 2), generator=g)
    counter = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    out = torch.full(r.shape, -7, dtype=r.dtype, device=DEVICE)
    got = normalize_ranges_triton(r.to(DEVICE), 80, out=out, counter=counter, kv_bytes_per_key=3).cpu()
    want = normalize_ranges(r, 80)
    assert torch.equal(got, want)
    L = int((want[..., 1] - want[..., 0]).sum())
    assert counter.tolist() == [L, 3 * L]
