"""The golden reference: two formulations agree, gradients are exact, empty rows are exact."""

import pytest
import torch

from selgate.reference import normalize_ranges, selection_attention_ref
from tests.helpers import random_inputs


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shape", [dict(S=5, S_kv=23), dict(S=1, S_kv=40), dict(S=9, S_kv=7), dict(S=4, S_kv=4, n=1)])
def test_gather_and_mask_agree(seed, shape):
    q, k, v, r = random_inputs(seed=seed, **shape)
    o1, l1 = selection_attention_ref(q, k, v, r, return_lse=True, formulation="gather")
    o2, l2 = selection_attention_ref(q, k, v, r, return_lse=True, formulation="mask")
    assert o1.dtype == torch.float64
    assert (o1 - o2).abs().max() <= 1e-12
    assert torch.equal(torch.isinf(l1), torch.isinf(l2))
    finite = torch.isfinite(l1)
    assert torch.allclose(l1[finite], l2[finite], rtol=0, atol=1e-12)


def test_low_precision_inputs_give_fp64_result():
    q, k, v, r = random_inputs(dtype=torch.float16)
    o = selection_attention_ref(q, k, v, r)
    o64 = selection_attention_ref(q.double(), k.double(), v.double(), r)
    assert o.dtype == torch.float64 and torch.equal(o, o64)


@pytest.mark.parametrize("formulation", ["gather", "mask"])
def test_gradcheck(formulation):
    q, k, v, r = random_inputs(B=1, S=3, G=2, h=2, Dk=4, Dv=3, S_kv=9, n=3, requires_grad=True)
    r[0, 1, 0] = 0  # one empty row: its lse is -inf, compared as 0 below

    def fn(q, k, v):
        o, lse = selection_attention_ref(q, k, v, r, formulation=formulation, return_lse=True)
        return o, torch.where(torch.isfinite(lse), lse, 0.0)

    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_empty_rows_are_exact_and_contribute_nothing():
    q, k, v, r = random_inputs(requires_grad=True)
    r[0, 1] = 0  # all padding for (b=0, s=1), every group
    r[1, 2, 1] = torch.tensor([[5, 5], [9, 3], [-4, 0], [40, 50]])  # empty, reversed, negative, beyond S_kv
    o, lse = selection_attention_ref(q, k, v, r, return_lse=True)
    for idx in [(0, 1), (1, 2, 1)]:
        assert torch.equal(o[idx], torch.zeros_like(o[idx]))
        assert bool(torch.isneginf(lse[idx]).all())
    (o.sum() + lse[torch.isfinite(lse)].sum()).backward()
    assert torch.equal(q.grad[0, 1], torch.zeros_like(q.grad[0, 1]))
    assert torch.equal(q.grad[1, 2, 1], torch.zeros_like(q.grad[1, 2, 1]))


def test_unselected_keys_get_exactly_zero_grad():
    q, k, v, r = random_inputs(S_kv=30, hi=20, requires_grad=True)
    selection_attention_ref(q, k, v, r).pow(2).sum().backward()
    norm = normalize_ranges(r, 30)
    key = torch.arange(30)
    used = ((key >= norm[..., 0:1]) & (key < norm[..., 1:2])).any(3).any(1)  # [B, G, S_kv]
    assert bool((~used).any()), "the case must leave some keys unselected"
    assert torch.equal(k.grad[~used], torch.zeros_like(k.grad[~used]))
    assert torch.equal(v.grad[~used], torch.zeros_like(v.grad[~used]))
    assert bool((k.grad[used].abs().sum(-1) > 0).any())


def test_causality_keys_beyond_t_never_contribute():
    q, k, v, r = random_inputs(S=6, S_kv=10)
    r[:] = torch.tensor([0, 10])  # ranges claim every key
    o = selection_attention_ref(q, k, v, r)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 5:] = float("nan")  # t of query 0 is 4: keys 5.. must never be read
    v2[:, :, 5:] = float("nan")
    o2 = selection_attention_ref(q, k2, v2, r)
    assert torch.equal(o[:, 0], o2[:, 0])


def test_chunked_gather_equals_one_chunk():
    q, k, v, r = random_inputs(requires_grad=True)
    o1 = selection_attention_ref(q, k, v, r)
    o2 = selection_attention_ref(q, k, v, r, budget_bytes=1)  # one row per chunk, checkpointed
    assert torch.equal(o1, o2)
    g1 = torch.autograd.grad(o1.sum(), (q, k, v))
    g2 = torch.autograd.grad(o2.sum(), (q, k, v))
    for a, b in zip(g1, g2):  # dk, dv sum row chunks in another order: measured max diff 2.2e-16
        assert (a - b).abs().max() <= 1e-13


def test_explicit_scale_and_positions():
    q, k, v, r = random_inputs(S=3, S_kv=12)
    pos = torch.tensor([[11, 3, 7], [0, 1, 2]])
    o1 = selection_attention_ref(q, k, v, r, scale=0.3, positions=pos)
    o2 = selection_attention_ref(q, k, v, r, scale=0.3, positions=pos, formulation="mask")
    assert (o1 - o2).abs().max() <= 1e-12
    assert not torch.equal(o1, selection_attention_ref(q, k, v, r, positions=pos))


def test_unknown_formulation_is_refused():
    q, k, v, r = random_inputs()
    with pytest.raises(ValueError, match="formulation: expected 'gather' or 'mask', got 'dense'"):
        selection_attention_ref(q, k, v, r, formulation="dense")
