"""Varlen: packing round-trips, and a packed call equals per-sequence calls."""

import pytest
import torch

from selgate.reference import pack_sequences, selection_attention_ref, unpack_sequences, varlen_to_batched
from tests.helpers import random_inputs


def test_pack_unpack_round_trip():
    seqs = [torch.randn(n, 3) for n in (4, 0, 7)]
    packed, cu = pack_sequences(seqs)
    assert cu.tolist() == [0, 4, 4, 11] and cu.dtype == torch.int32
    for a, b in zip(unpack_sequences(packed, cu), seqs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("seed", range(3))
def test_packed_equals_per_sequence(seed):
    lens = [(3, 9), (1, 5), (4, 4), (2, 11)]  # (S_q, S_kv) per sequence
    parts = [random_inputs(B=1, S=sq, S_kv=skv, seed=seed * 10 + i) for i, (sq, skv) in enumerate(lens)]
    q, cu_q = pack_sequences([p[0] for p in parts], dim=1)
    k, cu_k = pack_sequences([p[1] for p in parts], dim=2)
    v, _ = pack_sequences([p[2] for p in parts], dim=2)
    r, _ = pack_sequences([p[3] for p in parts], dim=1)
    glob, pos = varlen_to_batched(r, cu_q, cu_k)
    o = selection_attention_ref(q, k, v, glob, positions=pos)
    o_mask = selection_attention_ref(q, k, v, glob, positions=pos, formulation="mask")
    assert (o - o_mask).abs().max() <= 1e-12
    for part, o_seq in zip(parts, unpack_sequences(o, cu_q, dim=1)):
        assert torch.equal(o_seq, selection_attention_ref(*part))


@pytest.mark.parametrize(
    "cu_q, cu_k, match",
    [
        (torch.tensor([0, 2, 5]), torch.tensor([0, 4, 9]), r"cu_seqlens_q: expected non-decreasing offsets from 0 to 4"),
        (torch.tensor([0, 3, 2, 4]), torch.tensor([0, 1, 2, 3]), r"cu_seqlens_q: expected non-decreasing offsets"),
        (torch.tensor([0, 4]), torch.tensor([0, 4, 9]), r"cu_seqlens_k: expected shape \(2,\) like cu_seqlens_q"),
        (torch.tensor([[0, 4]]), torch.tensor([0, 4]), r"cu_seqlens_q: expected a 1-D int32/int64 tensor"),
        (torch.tensor([0, 2, 4]), torch.tensor([0, 7, 5]), r"cu_seqlens_k: expected non-decreasing offsets from 0 to 5"),
    ],
)
def test_bad_cu_seqlens(cu_q, cu_k, match):
    r = torch.zeros(1, 4, 1, 2, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match=match):
        varlen_to_batched(r, cu_q, cu_k)
