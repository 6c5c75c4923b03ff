"""The range builder (SPEC.md): Eq. 9 and 10, eligibility, forced blocks, ties, decode = prefill."""

import pytest
import torch

from selgate.reference import build_ranges, compressed_to_selection_scores, normalize_ranges


def blocks_of(ranges_row, l_sel):
    out = set()
    for a, b in ranges_row.tolist():
        out |= {key // l_sel for key in range(a, b)}
    return out


def test_heads_of_a_group_cannot_get_different_ranges():
    g = torch.Generator().manual_seed(0)
    B, S, G, h, nb = 2, 9, 2, 4, 9
    p = torch.rand(B, S, G * h, nb, generator=g)
    r = build_ranges(p, G=G, l_sel=4, n=3, S_kv=36)
    assert r.shape == (B, S, G, 3, 2)  # no head axis: one range set per group, by construction
    # scores move between the heads of a group but keep their group sum: ranges must not change
    shuffled = p.reshape(B, S, G, h, nb)
    shuffled = torch.cat([shuffled[:, :, :, 1:] * 0, shuffled.sum(3, keepdim=True)], dim=3).reshape(B, S, G * h, nb)
    assert torch.equal(build_ranges(shuffled, G=G, l_sel=4, n=3, S_kv=36), r)


def test_forced_eligible_and_top_n():
    l_sel, S_kv, n = 4, 40, 4
    p = torch.zeros(1, 1, 1, 10)
    p[..., 5] = 3.0  # best free block
    p[..., 9] = 100.0  # not eligible: first key 36 > t
    p[..., 2] = 1.0
    pos = torch.tensor([[29]])  # t = 29: current block 7, local blocks {6, 7}
    r = build_ranges(p, G=1, l_sel=l_sel, n=n, S_kv=S_kv, positions=pos)
    assert blocks_of(r[0, 0, 0], l_sel) == {0, 5, 6, 7}
    assert r[0, 0, 0].tolist() == [[0, 4], [20, 30], [0, 0], [0, 0]]  # 5,6,7 merged, clamped to t+1


def test_ties_go_to_the_lower_block():
    p = torch.ones(1, 1, 2, 8)
    r = build_ranges(p, G=1, l_sel=2, n=4, S_kv=16, n_local=1)
    assert blocks_of(r[0, 0, 0], 2) == {0, 1, 2, 7}


def test_decode_equals_prefill_rows():
    g = torch.Generator().manual_seed(1)
    S_kv, l_sel, G, h = 37, 4, 2, 3
    p = torch.rand(1, S_kv, G * h, 10, generator=g)
    prefill = build_ranges(p, G=G, l_sel=l_sel, n=4, S_kv=S_kv)
    for t in (0, 3, 4, 17, 36):
        decode = build_ranges(p[:, t : t + 1], G=G, l_sel=l_sel, n=4, S_kv=t + 1)
        assert torch.equal(decode[0, 0], prefill[0, t]), t


def test_output_is_normalised_and_int32():
    p = torch.rand(2, 6, 4, 5)
    r = build_ranges(p, G=2, l_sel=3, n=3, S_kv=14)
    assert r.dtype == torch.int32
    assert torch.equal(normalize_ranges(r, 14), r)


def test_eq9_mapping_matches_the_formula():
    g = torch.Generator().manual_seed(2)
    l_cmp, stride, l_sel, nb = 8, 4, 8, 6
    p_cmp = torch.rand(3, 11, generator=g, dtype=torch.float64)
    got = compressed_to_selection_scores(p_cmp, l_cmp=l_cmp, stride=stride, l_sel=l_sel, n_sel_blocks=nb)
    for j in range(nb):
        want = sum(
            p_cmp[:, (l_sel // stride) * j - m - n]
            for m in range(l_sel // stride)
            for n in range(l_cmp // stride)
            if 0 <= (l_sel // stride) * j - m - n < 11
        )
        assert torch.allclose(got[:, j], torch.as_tensor(want, dtype=torch.float64) + torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(p=torch.rand(2, 3, 4)), r"p_slc: expected a 4-D tensor \[B, S, G\*h, n_blocks\], got shape \(2, 3, 4\)"),
        (dict(G=3), r"p_slc: head count 4 is not a multiple of G=3"),
        (dict(n=0), r"need n >= 1, l_sel >= 1, n_local >= 0; got n=0"),
    ],
)
def test_builder_rejects_bad_arguments(kwargs, match):
    args = dict(p=torch.rand(1, 2, 4, 5), G=2, l_sel=4, n=2, S_kv=20)
    args.update(kwargs)
    p = args.pop("p")
    with pytest.raises(ValueError, match=match):
        build_ranges(p, **args)
