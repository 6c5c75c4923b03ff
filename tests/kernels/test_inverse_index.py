"""The inverse index (kernels/triton/inverse_index.py): every selected (row, key) once, in a fixed
order, and the row-major slots the KV-outer forward's merge reads its partials from."""

import torch

from selgate.kernels.triton.inverse_index import InverseIndex
from selgate.reference import normalize_ranges
from selgate.reference.ranges import key_limit
from tests.helpers import random_inputs


def _index(r, S_kv=50, block_n=16, chunk=3):
    norm = normalize_ranges(r, S_kv)
    return norm, InverseIndex(norm, key_limit(norm, S_kv)[:, :, 0, 0], G=norm.shape[2], S_kv=S_kv, block_n=block_n, chunk=chunk)


def test_lists_each_selected_key_once_in_row_order():
    _, _, _, r = random_inputs(B=2, S=7, G=2, S_kv=50, n=4, seed=5)
    norm, idx = _index(r)
    B, S, G = norm.shape[:3]
    seg = torch.repeat_interleave(idx.item_seg, idx.item_end - idx.item_start)
    pos = torch.cat([torch.arange(a, b) for a, b in zip(idx.item_start.tolist(), idx.item_end.tolist())])
    assert torch.equal(pos, torch.arange(len(idx.pair_row))), "work items tile the pair list in order"
    row = idx.pair_row
    b, g = row // (S * G), row % G
    assert torch.equal(seg, (b * G + g) * idx.n_tiles + idx.pair_lo // 16)
    assert bool(((idx.pair_hi - 1) // 16 == idx.pair_lo // 16).all()) and bool((idx.pair_hi > idx.pair_lo).all())
    # rows are non-decreasing inside each tile's list (a fixed order, no scheduling involved)
    same_seg = seg[1:] == seg[:-1]
    assert bool((row[1:][same_seg] >= row[:-1][same_seg]).all())
    # the pairs cover exactly the selected (row, key) set, each key once
    key = torch.arange(50)
    covered = torch.zeros(B * S * G, 50, dtype=torch.int64)
    for rw, lo, hi in zip(row.tolist(), idx.pair_lo.tolist(), idx.pair_hi.tolist()):
        covered[rw, lo:hi] += 1
    selected = ((key >= norm[..., 0:1]) & (key < norm[..., 1:2])).any(3).reshape(B * S * G, 50)
    assert torch.equal(covered, selected.long())


def test_each_rows_pairs_hold_the_slots_of_its_span_in_range_then_tile_order():
    _, _, _, r = random_inputs(B=2, S=7, G=2, S_kv=50, n=4, seed=6)
    r[1, 3, 1] = 0  # an empty row: a span of no slots
    norm, idx = _index(r)
    assert sorted(idx.pair_slot.tolist()) == list(range(idx.n_pairs)), "the slots are a permutation"
    start = idx.row_end - idx.row_pairs
    by_slot = torch.empty_like(idx.pair_row)
    by_slot[idx.pair_slot] = idx.pair_row
    lo_by_slot = torch.empty_like(idx.pair_lo)
    lo_by_slot[idx.pair_slot] = idx.pair_lo
    for row in range(norm.shape[0] * norm.shape[1] * norm.shape[2]):
        a, b = int(start[row]), int(idx.row_end[row])
        assert bool((by_slot[a:b] == row).all()), f"row {row}: its span holds another row's pairs"
        assert bool((lo_by_slot[a:b].diff() > 0).all()), f"row {row}: keys out of order"
    assert int(idx.row_pairs.view(2, 7, 2)[1, 3, 1]) == 0
