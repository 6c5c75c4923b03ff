"""The selection turned inside out: for every (b, g, KV tile), the (query row, key interval)
pairs that touch it, in a fixed order, cut into work items. Kernels that loop over KV tiles
outside and over the rows that selected each tile inside read it: the backward's dk/dv
(bwd.py) and the KV-tile-outer forward (kv_outer.py)."""

from __future__ import annotations

import torch

from .tiles import ceil_div

# Bytes of per-pair partial results (the KV-outer forward's softmax partials, the backward's dq
# shares) one launch may hold: past it the forward runs in row chunks and the backward takes
# its dq kernel. 4 GiB holds the 64k prefill's forward partials and dq shares at h = 1 (2.2 GB
# each, one after the other), and keeps its forward + backward under the 6.2 GiB that h = 16 takes.
PARTIALS_BUDGET = 4 << 30


class InverseIndex:
    """For every (b, g, KV tile): its (query row, key interval) pairs, and the work items
    (chunks of at most `chunk` pairs) a kernel runs, one program each.

    Pairs are generated row-major ((b, s, g), then range, then tile) and stably sorted by tile,
    so the order inside a tile is fixed. `pair_slot` is each sorted pair's position in the
    row-major order, and row `r`'s pairs hold slots `[row_end[r] - row_pairs[r], row_end[r])`:
    where a kernel writes a pair's partial result for a per-row merge to find, in a fixed order."""

    def __init__(self, norm_ranges: torch.Tensor, lim: torch.Tensor, G: int, S_kv: int, block_n: int, chunk: int):
        dev = norm_ranges.device
        B, S, _, n, _ = norm_ranges.shape
        self.n_tiles = ceil_div(S_kv, block_n)
        n_seg = B * G * self.n_tiles
        r = norm_ranges.to(torch.int64)
        start = r[..., 0].reshape(-1)
        end = torch.minimum(r[..., 1], lim[:, :, None, None]).reshape(-1)
        first = torch.div(start, block_n, rounding_mode="floor")
        tiles_per_range = torch.where(end > start, torch.div(end - 1, block_n, rounding_mode="floor") - first + 1, 0)
        ends = torch.cumsum(tiles_per_range, 0)
        total = int(ends[-1]) if ends.numel() else 0  # host sync 1: size of the pair list
        self.n_pairs = total
        self.row_pairs = tiles_per_range.view(B * S * G, n).sum(1)
        self.row_end = torch.cumsum(self.row_pairs, 0)
        rid = torch.repeat_interleave(torch.arange(start.numel(), device=dev), tiles_per_range, output_size=total)
        tile = first[rid] + torch.arange(total, device=dev) - (ends - tiles_per_range)[rid]
        row = torch.div(rid, n, rounding_mode="floor")  # flat (b, s, g)
        seg = (torch.div(row, S * G, rounding_mode="floor") * G + row % G) * self.n_tiles + tile
        # Pairs are generated in (b, s, g, range) order; a stable sort by tile keeps that order inside a tile.
        seg, order = torch.sort(seg, stable=True)
        rid, tile = rid[order], tile[order]
        self.pair_slot = order
        self.pair_row = row[order]
        self.pair_lo = torch.maximum(start[rid], tile * block_n).to(torch.int32)
        self.pair_hi = torch.minimum(end[rid], (tile + 1) * block_n).to(torch.int32)
        del rid, tile
        seg_off = torch.searchsorted(seg, torch.arange(n_seg + 1, device=dev))
        count = seg_off[1:] - seg_off[:-1]
        n_chunks = torch.div(count + chunk - 1, chunk, rounding_mode="floor")
        n_parts = torch.where(n_chunks > 1, n_chunks, 0)
        n_items, n_slots, n_multi = (
            int(x)
            for x in torch.stack(  # host sync 2: grid and partials size
                [n_chunks.sum(), n_parts.sum(), (n_parts > 0).sum()]
            ).tolist()
        )
        seg_ids = torch.arange(n_seg, device=dev)
        item_seg = torch.repeat_interleave(seg_ids, n_chunks, output_size=n_items)
        chunk_no = torch.arange(n_items, device=dev) - (torch.cumsum(n_chunks, 0) - n_chunks)[item_seg]
        self.item_seg = item_seg
        self.item_start = seg_off[item_seg] + chunk_no * chunk
        self.item_end = torch.minimum(self.item_start + chunk, seg_off[item_seg + 1])
        slot0 = torch.cumsum(n_parts, 0) - n_parts
        self.item_slot = torch.where(n_parts[item_seg] > 0, slot0[item_seg] + chunk_no, -1)
        self.multi_seg = torch.repeat_interleave(seg_ids, (n_parts > 0).to(torch.int64), output_size=n_multi)
        self.multi_slot = slot0[self.multi_seg]
        self.multi_count = n_parts[self.multi_seg]
        self.n_items, self.n_slots, self.n_multi = n_items, n_slots, n_multi

    def record_stream(self, stream: torch.cuda.Stream) -> None:
        """Mark the index's tensors as used on `stream` (built on another one), so the
        allocator does not reuse them before that stream's kernels are done."""
        for t in vars(self).values():
            if isinstance(t, torch.Tensor):
                t.record_stream(stream)
