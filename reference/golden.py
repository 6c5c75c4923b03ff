"""The golden reference of SPEC.md: fp64, from the two simplest correct formulations.

`gather` collects each row's selected keys from normalised ranges; `mask` builds a dense
boolean key mask straight from the raw ranges (union by `any`, causality by comparison).
They share no range logic, so their agreement (to 1e-12) also checks `normalize_ranges`.

Semantics decided where SPEC.md is silent:
- a query whose position `t` is negative (S > S_kv) selects nothing: `o = 0`, `lse = -inf`;
- the result is fp64 whatever the input dtype; gradients flow back in the inputs' dtype;
- `n = 0` or `S_kv = 0`: every row is empty (`o = 0`, `lse = -inf`, zero gradients);
- a non-empty row whose scaled scores are not all finite at the top (its largest score is
  NaN, +inf, or every score is -inf: a NaN in q or in a selected key, an infinite key) has
  `lse = NaN`, and its `o` is NaN: softmax is undefined there (inf / inf, 0 / 0), and NaN,
  unlike -inf, cannot be mistaken for an empty row. Every backend follows this: an online
  softmax gets NaN in its running sum in exactly these cases. A selected score of -inf next
  to a finite one is an ordinary zero weight.
"""

from __future__ import annotations

import torch

from .chunking import rows_per_chunk, run_chunked
from .ranges import expand_ranges, key_limit, normalize_ranges, selected_lengths
from .validation import check_inputs, resolve_scale

DEFAULT_BUDGET_BYTES = 1 << 30


def _softmax_attend(scores: torch.Tensor, valid: torch.Tensor, v_sel: torch.Tensor):
    """Masked softmax over the last dim of `scores` [..., h, L] and its product with
    `v_sel` [..., L, Dv]. Rows with no valid key give `o = 0`, `lse = -inf` and no gradient;
    a non-empty row whose largest score is not finite gives `lse = NaN` (module docstring)."""
    valid = valid.unsqueeze(-2)
    masked = scores.masked_fill(~valid, float("-inf"))
    m = masked.amax(-1, keepdim=True).detach()
    finite = torch.isfinite(m)
    m = torch.where(finite, m, torch.zeros_like(m))
    e = torch.where(valid, torch.exp(masked - m), torch.zeros_like(masked))
    denom = e.sum(-1, keepdim=True)
    nonempty = valid.any(-1, keepdim=True)
    safe = torch.where(nonempty, denom, torch.ones_like(denom))
    p = e / safe
    o = p @ v_sel
    lse = torch.where(finite, m + torch.log(safe), torch.full_like(denom, float("nan")))
    lse = torch.where(nonempty, lse, torch.full_like(denom, float("-inf")))
    return o, lse.squeeze(-1)


def gather_rows(q_rows, k_sel, v_sel, valid, scale: float, dtype):
    """Attention of rows against their gathered keys: q_rows [R, ..., h, Dk],
    k_sel/v_sel [R, ..., L, D], valid [R, ..., L]; computed in `dtype`. Entries that are not
    valid are zeroed first: an empty row's padding holds a key it did not select (key 0),
    and 0 * NaN there would reach o and dq when that key is poisoned."""
    keep = valid.unsqueeze(-1)
    k_sel, v_sel = torch.where(keep, k_sel.to(dtype), 0.0), torch.where(keep, v_sel.to(dtype), 0.0)
    scores = (q_rows.to(dtype) @ k_sel.transpose(-1, -2)) * scale
    return _softmax_attend(scores, valid, v_sel)


def gather_attention(q, k, v, norm_ranges, *, scale: float, dtype=torch.float64, budget_bytes: int = DEFAULT_BUDGET_BYTES):
    """Gather formulation over normalised ranges, computed in `dtype`.

    Rows are processed in chunks whose gathered K/V stay under `budget_bytes` (see
    `run_chunked`). Returns `o` [B, S, G, h, Dv] and `lse` [B, S, G, h] in `dtype`."""
    B, S, G, h, Dk = q.shape
    Dv = v.shape[-1]
    L_max = max(int(selected_lengths(norm_ranges).max()) if norm_ranges.numel() else 0, 1)
    item = torch.finfo(dtype).bits // 8
    chunk = rows_per_chunk(G * L_max * (Dk + Dv + 2 * h) * item, budget_bytes)
    gi = torch.arange(G, device=q.device)[None, :, None]

    def rows(q_rows, r_rows, b_rows, k, v):
        idx, valid = expand_ranges(r_rows, L_max)  # [R, G, L]
        bi = b_rows[:, None, None]
        return gather_rows(q_rows, k[bi, gi, idx], v[bi, gi, idx], valid, scale, dtype)

    b_of_row = torch.arange(B, device=q.device).repeat_interleave(S)
    o, lse = run_chunked(
        rows, (q.reshape(B * S, G, h, Dk), norm_ranges.reshape(B * S, G, -1, 2), b_of_row), chunk, const_args=(k, v)
    )
    return o.reshape(B, S, G, h, Dv), lse.reshape(B, S, G, h)


def mask_attention(q, k, v, ranges, *, scale: float, positions=None):
    """Dense-mask formulation straight from raw ranges, fp64. O(S * S_kv) memory: tiny shapes only."""
    B, S, G, h, Dk = q.shape
    S_kv = k.shape[2]
    r = ranges.to(torch.int64)
    key = torch.arange(S_kv, device=q.device)
    inside = (key >= r[..., 0:1]) & (key < r[..., 1:2])  # [B, S, G, n, S_kv]
    lim = key_limit(ranges, S_kv, positions)  # [B, S, 1, 1]
    mask = inside.any(3) & (key < lim)  # [B, S, G, S_kv]
    scores = torch.einsum("bsghd,bgkd->bsghk", q.double(), k.double()) * scale
    o, lse = _softmax_attend(scores, mask, v.double().unsqueeze(1).expand(B, S, G, S_kv, v.shape[-1]))
    return o, lse


def _no_keys(q, k, v):
    """Every row empty (no range slot, or no key): `o = 0`, `lse = -inf`, fp64, with a zero
    gradient for q, k and v (an empty sum keeps them in the graph; `0 * x` would be NaN for NaN x)."""
    B, S, G, h, _ = q.shape
    zero = sum(t.reshape(-1)[:0].double().sum() for t in (q, k, v))
    o = torch.zeros(B, S, G, h, v.shape[-1], dtype=torch.float64, device=q.device) + zero
    lse = torch.full((B, S, G, h), float("-inf"), dtype=torch.float64, device=q.device) + zero
    return o, lse


def selection_attention_ref(
    q,
    k,
    v,
    ranges,
    *,
    scale=None,
    positions=None,
    return_lse=False,
    formulation: str = "gather",
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
):
    """Golden selection attention in fp64 (SPEC.md); differentiable in q, k and v.

    `formulation` is "gather" (default, chunked, serves long prefills) or "mask"
    (dense, tiny shapes). Returns `o` fp64, or `(o, lse)` with `return_lse`."""
    dims = check_inputs(q, k, v, ranges, scale=scale, positions=positions)
    sc = resolve_scale(scale, dims.Dk)
    if formulation not in ("gather", "mask"):
        raise ValueError(f"formulation: expected 'gather' or 'mask', got {formulation!r}")
    if dims.n == 0 or dims.S_kv == 0:
        o, lse = _no_keys(q, k, v)
    elif formulation == "gather":
        norm = normalize_ranges(ranges, dims.S_kv, positions)
        o, lse = gather_attention(q, k, v, norm, scale=sc, budget_bytes=budget_bytes)
    else:
        o, lse = mask_attention(q, k, v, ranges, scale=sc, positions=positions)
    return (o, lse) if return_lse else o
