"""Range normalisation and validation: properties over random ranges (hypothesis)."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from selgate.reference import RangeError, expand_ranges, normalize_ranges, selected_keys, selected_lengths, validate_ranges

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def raw_ranges(draw):
    S_kv = draw(st.integers(1, 40))
    S = draw(st.integers(1, 6))
    n = draw(st.integers(1, 6))
    vals = draw(st.lists(st.integers(-5, S_kv + 8), min_size=2 * S * n, max_size=2 * S * n))
    dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    r = torch.tensor(vals, dtype=dtype).reshape(1, S, 1, n, 2)
    return r, S_kv


def key_sets(r, S_kv):
    """Python sets of selected keys per row, straight from SPEC.md's definition."""
    S = r.shape[1]
    out = []
    for s in range(S):
        lim = min(s + S_kv - S + 1, S_kv)
        keys = set()
        for a, b in r[0, s, 0].tolist():
            keys |= set(range(max(a, 0), min(b, lim)))
        out.append(keys)
    return out


@SETTINGS
@given(raw_ranges())
def test_normalize_preserves_union_within_causal_limit(case):
    r, S_kv = case
    norm = normalize_ranges(r, S_kv)
    assert norm.dtype == r.dtype and norm.shape == r.shape
    assert key_sets(norm, S_kv) == key_sets(r, S_kv)


@SETTINGS
@given(
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 5),
    st.integers(1, 4),
    st.integers(1, 30),
    st.booleans(),
    st.integers(0, 10_000),
)
def test_selected_keys_is_the_union_of_the_rows_key_sets(B, G, S, n, S_kv, explicit, seed):
    """Per (b, g), straight from SPEC.md: keys in some row's [start, end) below min(t + 1, S_kv)."""
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(-3, S_kv + 5, (B, S, G, n, 2), generator=gen, dtype=torch.int32)
    pos = torch.randint(-2, S_kv + 3, (B, S), generator=gen) if explicit else None
    got = selected_keys(r, S_kv, pos)
    for b, g in itertools.product(range(B), range(G)):
        want = set()
        for s in range(S):
            t = int(pos[b, s]) if explicit else s + S_kv - S
            for a, e in r[b, s, g].tolist():
                want |= set(range(max(a, 0), min(e, t + 1, S_kv)))
        assert got[b, g].nonzero().flatten().tolist() == sorted(want)


@SETTINGS
@given(raw_ranges())
def test_normalize_is_idempotent_and_valid(case):
    r, S_kv = case
    norm = normalize_ranges(r, S_kv)
    assert torch.equal(normalize_ranges(norm, S_kv), norm)
    validate_ranges(norm, S_kv)


@SETTINGS
@given(raw_ranges())
def test_normalized_never_reaches_past_t_or_s_kv(case):
    r, S_kv = case
    norm = normalize_ranges(r, S_kv).to(torch.int64)
    S = r.shape[1]
    t = torch.arange(S) + S_kv - S
    real = norm[..., 1] > norm[..., 0]
    assert bool((norm[..., 1][real] <= S_kv).all())
    assert bool(((norm[..., 1] - 1) <= t[None, :, None, None])[real].all())
    # canonical form: real ranges first, disjoint with gaps, padding exactly (0, 0)
    assert bool((norm[~real] == 0).all())
    assert bool((real[..., 1:] <= real[..., :-1]).all())
    assert bool((norm[..., 1:, 0] > norm[..., :-1, 1])[real[..., 1:]].all())


@SETTINGS
@given(raw_ranges())
def test_expand_lists_each_selected_key_once_in_order(case):
    r, S_kv = case
    norm = normalize_ranges(r, S_kv)
    L = selected_lengths(norm)
    idx, valid = expand_ranges(norm, int(L.max()) + 2)
    for s, keys in enumerate(key_sets(r, S_kv)):
        assert idx[0, s, 0][valid[0, s, 0]].tolist() == sorted(keys)
        assert int(L[0, s, 0]) == len(keys)


def test_normalize_merges_adjacent_and_overlapping():
    r = torch.tensor([[5, 9], [0, 3], [2, 4], [9, 10], [0, 0], [20, 30]]).reshape(1, 1, 1, 6, 2)
    expect = torch.tensor([[0, 4], [5, 10], [20, 25], [0, 0], [0, 0], [0, 0]])
    assert torch.equal(normalize_ranges(r, 25)[0, 0, 0], expect)


def test_validate_names_first_offending_entry():
    r = torch.tensor([[0, 4], [2, 6], [10, 30]]).reshape(1, 1, 1, 3, 2)
    with pytest.raises(RangeError, match=r"ranges\[0, 0, 0, 1\] = \(2, 6\) overlaps or precedes an earlier range"):
        validate_ranges(r, 25)
    r = torch.tensor([[0, 4], [10, 30]]).reshape(1, 1, 1, 2, 2)
    with pytest.raises(
        RangeError,
        match=r"ranges\[0, 0, 0, 1\] = \(10, 30\) outside \[0, min\(t\+1, S_kv\)\); "
        r"row limit min\(t\+1, S_kv\) = 25",
    ):
        validate_ranges(r, 25)


def test_validate_accepts_padding_anywhere():
    r = torch.tensor([[0, 0], [0, 4], [7, 3], [6, 8]]).reshape(1, 1, 1, 4, 2)
    validate_ranges(r, 25)


def test_positions_override_causal_limit():
    r = torch.tensor([[0, 20]]).reshape(1, 1, 1, 1, 2).repeat(1, 2, 1, 1, 1)
    norm = normalize_ranges(r, 25, positions=torch.tensor([[3, -1]]))
    assert norm[0, :, 0, 0].tolist() == [[0, 4], [0, 0]]
