"""The range builder of SPEC.md (NSA Eq. 9 and 10): block scores in, ranges out.

Ranges are chosen per group from scores summed over the group's heads, so the `h`
heads of a group share their ranges by construction: the output has no head axis.
"""

from __future__ import annotations

import torch

from .ranges import normalize_ranges, query_positions


def compressed_to_selection_scores(
    p_cmp: torch.Tensor, *, l_cmp: int, stride: int, l_sel: int, n_sel_blocks: int
) -> torch.Tensor:
    """NSA Eq. 9: score of selection block j = sum over m < l_sel/stride, k < l_cmp/stride of
    `p_cmp[..., (l_sel/stride) * j - m - k]`, indices outside `[0, n_cmp)` skipped."""
    if l_sel % stride or l_cmp % stride:
        raise ValueError(f"l_sel={l_sel} and l_cmp={l_cmp} must be multiples of stride={stride}")
    n_cmp = p_cmp.shape[-1]
    j = torch.arange(n_sel_blocks, device=p_cmp.device)[:, None, None]
    m = torch.arange(l_sel // stride, device=p_cmp.device)[None, :, None]
    k = torch.arange(l_cmp // stride, device=p_cmp.device)[None, None, :]
    idx = ((l_sel // stride) * j - m - k).reshape(n_sel_blocks, -1)
    ok = (idx >= 0) & (idx < n_cmp)
    gathered = p_cmp[..., idx.clamp(0, max(n_cmp - 1, 0))]
    return torch.where(ok, gathered, torch.zeros_like(gathered)).sum(-1)


def build_ranges(
    p_slc: torch.Tensor, *, G: int, l_sel: int, n: int, S_kv: int, n_local: int = 2, positions=None, dtype=torch.int32
) -> torch.Tensor:
    """Ranges [B, S, G, n, 2] from per-head block scores `p_slc` [B, S, G*h, n_blocks].

    Eq. 10 group sum; a block is eligible when its first key is `<= t`; block 0 and the
    `n_local` blocks ending at `t` are forced; the rest by top-n score with ties toward the
    lower block index; blocks become clamped, merged, `(0, 0)`-padded ranges. Depends on
    `t` only, never on `S`, so decode and prefill agree."""
    if p_slc.dim() != 4:
        raise ValueError(f"p_slc: expected a 4-D tensor [B, S, G*h, n_blocks], got shape {tuple(p_slc.shape)}")
    B, S, H, nb = p_slc.shape
    if G < 1 or H % G:
        raise ValueError(f"p_slc: head count {H} is not a multiple of G={G}")
    if n < 1 or l_sel < 1 or n_local < 0:
        raise ValueError(f"need n >= 1, l_sel >= 1, n_local >= 0; got n={n}, l_sel={l_sel}, n_local={n_local}")
    p_grp = p_slc.reshape(B, S, G, H // G, nb).sum(3)
    t = query_positions(B, S, S_kv, p_slc.device, positions)[:, :, None, None]
    blk = torch.arange(nb, device=p_slc.device)
    eligible = (blk * l_sel <= t) & (blk * l_sel < S_kv)
    cur = torch.div(t, l_sel, rounding_mode="floor")
    forced = eligible & ((blk == 0) | ((blk <= cur) & (blk > cur - n_local)))
    score = torch.where(eligible, p_grp.to(torch.float64), float("-inf"))
    score = torch.where(forced, float("inf"), score)
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :n]
    chosen = torch.gather(score, -1, order) > float("-inf")
    start = order * l_sel
    end = torch.minimum((order + 1) * l_sel, torch.clamp(t + 1, max=S_kv))
    ranges = torch.stack([torch.where(chosen, start, 0), torch.where(chosen, end, 0)], dim=-1)
    if ranges.shape[3] < n:
        pad = torch.zeros(*ranges.shape[:3], n - ranges.shape[3], 2, dtype=ranges.dtype, device=ranges.device)
        ranges = torch.cat([ranges, pad], dim=3)
    return normalize_ranges(ranges, S_kv, positions).to(dtype)
