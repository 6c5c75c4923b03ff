"""Small pure-torch NSA kernels in the block-index forms found in the wild, written for the
tests: as an outside kernel author would hand them to selgate, correct and deliberately
broken. Nothing here imports selgate except through its public adapters."""

from __future__ import annotations

import torch

from selgate.conformance.adapters import padded_block_kernel, varlen_block_kernel

BLOCK = 8


def _attend(q, k, v, mask, scale):
    """Masked attention per row, reading no key outside `mask` (unselected keys may hold NaN):
    q [B, T, H, g, D], k/v [B, Tk, H, D], mask [B, T, H, Tk]."""
    m = mask[..., None]
    k_rows = torch.where(m, k.permute(0, 2, 1, 3)[:, None], 0).float()  # [B, T, H, Tk, D]
    v_rows = torch.where(m, v.permute(0, 2, 1, 3)[:, None], 0).float()
    s = torch.einsum("bthgd,bthkd->bthgk", q.float(), k_rows) * scale
    sel = mask[:, :, :, None, :]
    top = torch.where(sel, s, float("-inf")).amax(-1, keepdim=True).clamp(min=-1e30)
    # exp of -inf where unselected: exp(0 - top) there overflows at scores near -120, and
    # torch.where's backward would then give 0 * inf = NaN
    p = torch.exp(torch.where(sel, s - top, float("-inf")))
    total = p.sum(-1, keepdim=True)
    o = torch.einsum("bthgk,bthkd->bthgd", p, v_rows) / torch.where(total > 0, total, 1.0)
    return o.to(v.dtype)


def _attend_nan_empty(q, k, v, mask, scale):
    """As `_attend`, but values weighed densely (p @ v over every key, unselected ones by a
    zero weight) and an empty row dividing 0 by 0: its NaN reaches every key's dv in the
    backward (0 * NaN), as in kernels whose backward shares terms between rows."""
    s = torch.einsum("bthgd,bkhd->bthgk", q.float(), k.float()) * scale
    sel = mask[:, :, :, None, :]
    top = torch.where(sel, s, float("-inf")).amax(-1, keepdim=True).clamp(min=-1e30)
    p = torch.where(sel, torch.exp(torch.where(sel, s, 0.0) - top), 0.0)
    return (torch.einsum("bthgk,bkhd->bthgd", p, v.float()) / p.sum(-1, keepdim=True)).to(v.dtype)


def padded_nsa(
    q, k, v, *, block_indices, block_counts, block_size, scale, cu_seqlens=None, whole_last_block=False, attend=_attend
):
    """fla-core's layout: q [B, T, HQ, D], k/v [B, T_kv, H, D], block_indices [B, T, H, S]
    (-1 padded), block_counts [B, T, H]; queries are the last T positions. With
    `whole_last_block` the causal mask stops at the end of the block holding t (the bug)."""
    if cu_seqlens is not None:
        cu_q, cu_k = cu_seqlens if isinstance(cu_seqlens, tuple) else (cu_seqlens, cu_seqlens)
        cq, ck = cu_q.tolist(), cu_k.tolist()
        return torch.cat(
            [
                padded_nsa(
                    q[:, a:b],
                    k[:, c:d],
                    v[:, c:d],
                    block_indices=block_indices[:, a:b],
                    block_counts=block_counts[:, a:b],
                    block_size=block_size,
                    scale=scale,
                    whole_last_block=whole_last_block,
                    attend=attend,
                )
                for a, b, c, d in zip(cq[:-1], cq[1:], ck[:-1], ck[1:])
            ],
            1,
        )
    B, T, HQ, D = q.shape
    Tk, H = k.shape[1:3]
    t = torch.arange(T, device=q.device) + Tk - T
    key = torch.arange(Tk, device=q.device)
    ids = block_indices.long()
    nb = (Tk + block_size - 1) // block_size
    valid = (ids >= 0) & (torch.arange(ids.shape[-1], device=q.device) < block_counts[..., None])
    chosen = torch.zeros(B, T, H, nb + 1, dtype=torch.bool, device=q.device)
    chosen.scatter_(-1, torch.where(valid & (ids < nb), ids, nb), True)
    limit = (t // block_size + 1) * block_size - 1 if whole_last_block else t
    mask = chosen[..., key // block_size] & (key <= limit[:, None])[None, :, None]
    return attend(q.unflatten(2, (H, HQ // H)), k, v, mask, scale).flatten(2, 3)


def padded_nsa_whole_last_block(q, k, v, **kw):
    return padded_nsa(q, k, v, whole_last_block=True, **kw)


def padded_nsa_nan_empty(q, k, v, **kw):
    return padded_nsa(q, k, v, attend=_attend_nan_empty, **kw)


def topk_nsa(q, k, v, topk_idx, block_size, cu_seqlens, scale):
    """native-sparse-attention-triton's layout: q [total, HQ, D], k/v [total, H, D],
    topk_idx [H, total, S] (-1 padded), one cu_seqlens for queries and keys."""
    ids = topk_idx.permute(1, 0, 2)[None]
    counts = torch.full(ids.shape[:3], ids.shape[-1], dtype=torch.int32, device=q.device)
    return padded_nsa(
        q[None],
        k[None],
        v[None],
        block_indices=ids,
        block_counts=counts,
        block_size=block_size,
        scale=scale,
        cu_seqlens=cu_seqlens.long(),
    )[0]


def _declare(fn):
    fn.dtypes = ("fp32", "fp16")
    fn.backward = True
    fn.heads_power_of_two = True
    fn.min_heads = 2
    return fn


fla_style = _declare(padded_block_kernel(padded_nsa, BLOCK))
fla_style_full_queries = _declare(padded_block_kernel(padded_nsa, BLOCK, full_queries=True))
fla_style_broken_causal = _declare(padded_block_kernel(padded_nsa_whole_last_block, BLOCK))
nsa_triton_style = _declare(varlen_block_kernel(topk_nsa, BLOCK))
fla_style_nan_empty = _declare(padded_block_kernel(padded_nsa_nan_empty, BLOCK, full_queries=True))
