"""Packed-SDPA selection attention: the CPU default and the production fallback.

Rows are bucketed by selected length `L` (next power of two, at least 16), and each
bucket runs as one batched attention: one "batch" entry per (b, s, g) row, its `h` heads
as queries, its gathered keys padded to the bucket length and masked. The softmax is a
full softmax over the selected keys (never `is_causal`, which with one query attends only
to the first key). Empty rows never reach SDPA: they stay exact zeros with `lse = -inf`.
SDPA runs forward-only calls; with gradients (or the LSE) each bucket runs an explicit fp32
softmax instead, because SDPA's memory-efficient backward is not bitwise deterministic (its
dq differed in every repeat on the H100) and SPEC.md requires it. Autograd flows through the
gather and that softmax; chunks are checkpointed under a memory budget.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from selgate.reference.chunking import rows_per_chunk, run_chunked
from selgate.reference.golden import DEFAULT_BUDGET_BYTES, gather_rows
from selgate.reference.ranges import expand_ranges, normalize_ranges, selected_lengths
from selgate.reference.validation import check_inputs, resolve_scale

MIN_BUCKET = 16


class _GatherKV(torch.autograd.Function):
    """`k[rows[:, None], idx]` and `v[...]` (the selected keys of each row), whose backward
    sums each key's gradients in one fixed order, as SPEC.md requires of dk and dv: the
    indexing's own backward (index_put accumulate) summed a key that several rows select in
    a run-dependent order on the CPU. The sums run in the dtype of k and v, which the caller
    makes fp32 (at least) when gradients are wanted."""

    @staticmethod
    def forward(ctx, k, v, rows, idx):
        ctx.save_for_backward(rows, idx)
        ctx.shapes = (k.shape, v.shape)
        return k[rows[:, None], idx], v[rows[:, None], idx]

    @staticmethod
    def backward(ctx, gk, gv):
        rows, idx = ctx.saved_tensors
        S_kv = ctx.shapes[0][1]
        flat = (rows[:, None] * S_kv + idx).reshape(-1)
        order = torch.sort(flat, stable=True).indices
        keys, counts = torch.unique_consecutive(flat[order], return_counts=True)

        def summed(g, shape, needed):
            if not needed:
                return None
            out = g.new_zeros(shape[0] * S_kv, shape[2])
            out[keys] = torch.segment_reduce(g.reshape(-1, shape[2])[order], "sum", lengths=counts)
            return out.view(shape)

        return (
            summed(gk, ctx.shapes[0], ctx.needs_input_grad[0]),
            summed(gv, ctx.shapes[1], ctx.needs_input_grad[1]),
            None,
            None,
        )


def bucket_lengths(L: torch.Tensor) -> torch.Tensor:
    """Padded length of each row's bucket: the next power of two >= L, at least MIN_BUCKET;
    0 for empty rows."""
    cap = torch.exp2(torch.ceil(torch.log2(L.clamp(min=1).double()))).long().clamp(min=MIN_BUCKET)
    return torch.where(L > 0, cap, 0)


def sdpa_backends() -> list[SDPBackend]:
    """The SDPA backends the caller has enabled, less cuDNN (MATH if that leaves none): cuDNN
    attention plans each new shape on the host, and a bucket's row count changes from call to
    call; on the H100 (torch 2.11) such calls took 90-160 ms against at most 4.7 ms without it
    (docs/design/dispatcher.md). The choice is torch's process-wide SDPA state."""
    enabled = {
        SDPBackend.FLASH_ATTENTION: torch.backends.cuda.flash_sdp_enabled(),
        SDPBackend.EFFICIENT_ATTENTION: torch.backends.cuda.mem_efficient_sdp_enabled(),
        SDPBackend.MATH: torch.backends.cuda.math_sdp_enabled(),
    }
    return [b for b, on in enabled.items() if on] or [SDPBackend.MATH]


def selection_attention_sdpa(
    q,
    k,
    v,
    ranges,
    *,
    scale=None,
    positions=None,
    return_lse=False,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    normalized: bool = False,
):
    """Selection attention through bucketed SDPA; same contract as the reference.

    `normalized=True` skips normalisation when the caller already did it. With `return_lse` or
    gradients each bucket runs an explicit softmax in fp32 (fp64 for fp64 inputs): the LSE is
    exact and the backward deterministic."""
    d = check_inputs(q, k, v, ranges, scale=scale, positions=positions)
    sc = resolve_scale(scale, d.Dk)
    norm = ranges if normalized else normalize_ranges(ranges, d.S_kv, positions)
    rows_total = d.B * d.S * d.G
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    flat_r = norm.reshape(rows_total, d.n, 2)
    cap = bucket_lengths(selected_lengths(norm).reshape(rows_total))
    qf = q.reshape(rows_total, d.h, d.Dk)
    kf = k.reshape(d.B * d.G, d.S_kv, d.Dk)
    vf = v.reshape(d.B * d.G, d.S_kv, d.Dv)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    exact = return_lse or grad  # the explicit softmax (module docstring)
    backends = None if exact else sdpa_backends()
    if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
        # dk and dv then sum in fp32 (at least) over every row, chunk and bucket, and are
        # rounded to k's dtype once (SPEC.md: no bf16 partials before the reduction)
        kf, vf = kf.to(acc_dtype), vf.to(acc_dtype)
    row_id = torch.arange(rows_total, device=q.device)
    bg = row_id // (d.S * d.G) * d.G + row_id % d.G  # (b, g) of each (b, s, g) row

    done_rows, done_o, done_lse = [], [], []
    for Lb in torch.unique(cap[cap > 0]).tolist():
        rows = row_id[cap == Lb]

        def attend(q_rows, r_rows, bg_rows, kf, vf, Lb=Lb):
            idx, valid = expand_ranges(r_rows, Lb)  # [R, Lb]
            k_sel, v_sel = _GatherKV.apply(kf, vf, bg_rows, idx)  # in acc_dtype when gradients are wanted
            if exact:  # computes in acc_dtype anyway
                o, lse = gather_rows(q_rows, k_sel, v_sel, valid, sc, acc_dtype)
                return (o.to(v.dtype), lse) if return_lse else (o.to(v.dtype),)
            with sdpa_kernel(backends):
                o = F.scaled_dot_product_attention(
                    q_rows[:, None],
                    k_sel.to(k.dtype)[:, None],
                    v_sel.to(v.dtype)[:, None],
                    attn_mask=valid[:, None, None, :],
                    scale=sc,
                )
            return (o[:, 0],)

        item = q.element_size()
        chunk = rows_per_chunk(Lb * (d.Dk + d.Dv + 2 * d.h + 1) * max(item, 4), budget_bytes)
        out = run_chunked(attend, (qf[rows], flat_r[rows], bg[rows]), chunk, const_args=(kf, vf))
        done_rows.append(rows)
        done_o.append(out[0])
        if return_lse:
            done_lse.append(out[1])

    o = torch.zeros(rows_total, d.h, d.Dv, dtype=v.dtype, device=q.device)
    lse = torch.full((rows_total, d.h), float("-inf"), dtype=acc_dtype, device=q.device)
    if done_rows:
        rows = torch.cat(done_rows)
        o = o.index_copy(0, rows, torch.cat(done_o))
        if return_lse:
            lse = lse.index_copy(0, rows, torch.cat(done_lse))
    elif grad:
        o = o + sum(t.reshape(-1)[:0].sum() for t in (q, k, v))  # all rows empty: keep o in the graph, zero grads
    o = o.reshape(d.B, d.S, d.G, d.h, d.Dv)
    return (o, lse.reshape(d.B, d.S, d.G, d.h)) if return_lse else o
