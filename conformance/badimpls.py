"""Known-bad implementations for the harness self-test: each carries one bug seen in NSA
code (SPEC.md, "Historical mistakes", and others) and names the family that must catch it.

All are built on one correct gather implementation (`attend`, fp64 over the reference's
range helpers) with a single fault injected, so a family that flags one flags that fault.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass

import torch

from selgate.reference import (
    check_inputs,
    expand_ranges,
    normalize_ranges,
    resolve_scale,
    selected_keys,
    selected_lengths,
    selection_attention_ref,
    varlen_to_batched,
)
from selgate.reference.golden import gather_rows
from selgate.reference.ranges import key_limit

from .impl import ALL_DTYPES, Impl

FIRST_TILE = 16  # BLOCK_L of the truncated tile loop
TILES_READ = 128  # keys a row's tile loop reads before it stops (SPEC.md's listed mistake)


def attend(q, k, v, ranges, *, scale=None, positions=None, check=True, norm=None, keys=None, scale_of=None, rows=None):
    """Correct selection attention `(o, lse)` by gathering each row's keys, with hooks to
    inject a fault: `norm(ranges, S_kv, positions)` (range handling), `keys(idx, valid)`
    (which gathered keys count), `scale_of(scale, Dk)`, `rows` (the softmax over the gathered
    keys, `gather_rows`'s signature)."""
    if check:
        check_inputs(q, k, v, ranges, scale=scale, positions=positions)
    B, S, G, h, Dk = q.shape
    nr = (norm or normalize_ranges)(ranges.to(torch.int64), k.shape[2], positions)
    idx, valid = expand_ranges(nr, max(int(selected_lengths(nr).max()), 1))
    if keys is not None:
        idx, valid = keys(idx, valid)
    bi = torch.arange(B, device=q.device)[:, None, None, None]
    gi = torch.arange(G, device=q.device)[None, None, :, None]
    sc = (scale_of or resolve_scale)(scale, Dk)
    o, lse = (rows or gather_rows)(q, k[bi, gi, idx], v[bi, gi, idx], valid, sc, torch.float64)
    return o.to(v.dtype), lse.to(torch.promote_types(q.dtype, torch.float32))


def _fp32_softmax(offset):
    """`gather_rows` as an fp32 kernel computes it, with `offset(scores)` in place of each row's
    own max (scores [..., h, L], masked keys -inf; the offset broadcasts against them)."""

    def rows(q, k_sel, v_sel, valid, scale, dtype):
        keep = valid.unsqueeze(-2)
        k_sel, v_sel = (torch.where(valid.unsqueeze(-1), t.float(), 0.0) for t in (k_sel, v_sel))
        scores = ((q.float() @ k_sel.transpose(-1, -2)) * scale).masked_fill(~keep, float("-inf"))
        m = offset(scores)
        e = torch.where(keep, torch.exp(scores - m), 0.0)
        total = e.sum(-1, keepdim=True)
        nonempty = keep.any(-1, keepdim=True)
        o = torch.where(nonempty, (e @ v_sel) / torch.where(nonempty, total, 1.0), 0.0)
        lse = torch.where(nonempty, m + torch.log(total), float("-inf"))
        return o, lse.squeeze(-1)

    return rows


def _no_max(q, k, v, ranges, *, scale=None, positions=None):
    """Softmax as exp(s) / sum exp(s): exact but for overflow, which N(0, 1) inputs never reach."""
    return attend(q, k, v, ranges, scale=scale, positions=positions, rows=_fp32_softmax(lambda s: torch.zeros_like(s[..., :1])))


def _group_max(q, k, v, ranges, *, scale=None, positions=None):
    """One max per group's tile (over all its heads) in place of each head's own max: heads of
    much smaller scores underflow to 0 / 0."""
    return attend(q, k, v, ranges, scale=scale, positions=positions, rows=_fp32_softmax(lambda s: s.amax((-2, -1), keepdim=True)))


def _group_zero_keys(q, k, v, ranges, *, scale=None, positions=None):
    """Every KV group reads group 0's keys and values (a group stride of 0)."""
    return attend(q, k[:, :1].expand_as(k), v[:, :1].expand_as(v), ranges, scale=scale, positions=positions)


def _heads_by_shift(q, k, v, ranges, *, scale=None, positions=None):
    """The group of flat head j computed as j >> log2(h) with log2 rounded down: right when h is
    a power of two; otherwise heads read another group's ranges and keys."""
    B, S, G, h, Dk = q.shape
    j = torch.arange(G * h, device=q.device)
    group = (j >> (h.bit_length() - 1)).clamp(max=G - 1)
    o, lse = attend(
        q.reshape(B, S, G * h, 1, Dk), k[:, group], v[:, group], ranges[:, :, group], scale=scale, positions=positions
    )
    return o.reshape(B, S, G, h, -1), lse.reshape(B, S, G, h)


def _groups_padded(q, k, v, ranges, *, scale=None, positions=None):
    """K/V of (b, g) addressed at b * G' + g with G' the next power of two above G (a batch
    stride of G' groups): right when G is a power of two; otherwise later batches read the
    wrong groups."""
    B, G = k.shape[:2]
    padded = 1 << (G - 1).bit_length()
    row = (torch.arange(B, device=q.device)[:, None] * padded + torch.arange(G, device=q.device)).clamp(max=B * G - 1)
    k, v = (t.reshape(B * G, *t.shape[2:])[row] for t in (k, v))
    return attend(q, k, v, ranges, scale=scale, positions=positions)


def _head_dim_rounded_down(q, k, v, ranges, *, scale=None, positions=None):
    """Scores over the first 2^floor(log2 Dk) head dims only (a BLOCK_D rounded down)."""
    Dk = q.shape[-1]
    keep = torch.arange(Dk, device=q.device) < 1 << (Dk.bit_length() - 1)
    return attend(q * keep, k, v, ranges, scale=scale, positions=positions)


def _ignores_k_offset(q, k, v, ranges, *, scale=None, positions=None):
    """k read from the start of its storage (a pointer taken from the storage, not the view):
    right for any k but a view at an offset, as `cache[1:]` is."""
    return attend(q, k.as_strided(k.shape, k.stride(), 0), v, ranges, scale=scale, positions=positions)


def _int32_wrapped(t):
    """`t` [B, ...] with each batch's offset `b * stride(0)` computed in 32 bits: past 2^31 elements
    it wraps (here, as a kernel masking the sign bit away would), and a later batch reads from near
    the storage's start. Right while a tensor spans less than 2^31 elements."""
    from .families.dtype import FAR  # 2^31: where the dtype family's far batches start

    starts = [(t.storage_offset() + b * t.stride(0)) % FAR for b in range(t.shape[0])]
    return torch.stack([t.as_strided(t.shape[1:], t.stride()[1:], s) for s in starts])


def _int32_batch_offsets(q, k, v, ranges, *, scale=None, positions=None):
    """K/V batch offsets in 32 bits (`_int32_wrapped`) in the forward."""
    return attend(q, _int32_wrapped(k), _int32_wrapped(v), ranges, scale=scale, positions=positions)


class _WrongBackward(torch.autograd.Function):
    """The correct forward; gradients recomputed from `reads(t)` of q, k, v with `rows` as the
    softmax (`attend`'s hook), as a backward kernel written apart from its forward can."""

    @staticmethod
    def forward(ctx, reads, rows, q, k, v, ranges, scale, positions):
        ctx.save_for_backward(q, k, v, ranges, positions)
        ctx.reads, ctx.rows, ctx.scale = reads, rows, scale
        return attend(q, k, v, ranges, scale=scale, positions=positions)

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, ranges, positions = ctx.saved_tensors
        leaves = [ctx.reads(t).detach().clone().requires_grad_() for t in (q, k, v)]
        with torch.enable_grad():
            o, lse = attend(*leaves, ranges, scale=ctx.scale, positions=positions, rows=ctx.rows)
            grads = torch.autograd.grad((o, lse), leaves, (do, dlse))
        return (None, None, *grads, None, None, None)


def _backward_by(reads=lambda t: t, rows=None):
    return lambda q, k, v, ranges, *, scale=None, positions=None: _WrongBackward.apply(
        reads, rows, q, k, v, ranges, scale, positions
    )


def _normalises_in_place(q, k, v, ranges, *, scale=None, positions=None):
    """Ranges normalised (clamped, sorted, merged) into the caller's tensor: this call's answer
    is right, the caller's ranges are not theirs any more."""
    with torch.no_grad():
        ranges.copy_(normalize_ranges(ranges, k.shape[2], positions))
    return attend(q, k, v, ranges, scale=scale, positions=positions)


def _pv_over_shared_keys(q, k, v, ranges, *, scale=None, positions=None):
    """P.V of each (b, g) as one product over the keys any of its rows selects (a KV-outer or
    shared-tile kernel, keys no row selects never loaded): a row's zero weight times a NaN in
    V at another row's key is NaN in that row too."""
    o, lse = attend(q, k, v, ranges, scale=scale, positions=positions)
    used = selected_keys(ranges, k.shape[2], positions)[..., None]
    zero = (v.masked_fill(~used, 0) * 0).sum(2)  # [B, G, Dv]: the zero products, NaN where a used key's v is
    return o + zero[:, None, :, None, :].to(o.dtype), lse


def _dq_scaled_by_dv(q, k, v, ranges, *, scale=None, positions=None):
    """dq computed with 1/sqrt(Dv) in place of 1/sqrt(Dk): right whenever Dv == Dk."""
    factor = math.sqrt(q.shape[-1] / v.shape[-1])
    return attend(_GradTimes.apply(q, factor), k, v, ranges, scale=scale, positions=positions)


def _concat_slots(ranges, S_kv, positions):
    """The overlapping-ranges bug: each range clamped on its own, then concatenated, so a
    key inside two ranges is gathered twice. Returns (idx, valid) for `attend`'s `keys`."""
    r = torch.minimum(ranges.clamp(min=0), key_limit(ranges, S_kv, positions)[..., None])
    parts = [expand_ranges(r[..., j : j + 1, :], S_kv) for j in range(r.shape[3])]
    return torch.cat([p[0] for p in parts], -1), torch.cat([p[1] for p in parts], -1)


def _overlap_twice(q, k, v, ranges, *, scale=None, positions=None):
    idx, valid = _concat_slots(ranges.to(torch.int64), k.shape[2], positions)
    return attend(q, k, v, ranges, scale=scale, positions=positions, keys=lambda *_: (idx, valid))


def _positions(value_of):
    """A range-normalisation that uses wrong query positions `value_of(B, S, S_kv)`."""
    return lambda r, S_kv, positions: normalize_ranges(r, S_kv, value_of(r.shape[0], r.shape[1], S_kv).to(r.device))


def _normalised_by(norm):
    """The correct implementation with the ranges normalised by `norm(ranges, S_kv, positions)`."""
    return lambda q, k, v, r, *, scale=None, positions=None: attend(q, k, v, r, scale=scale, positions=positions, norm=norm)


def _with_output(fix):
    """Post-process `(o, lse)` of the correct implementation with `fix(q, k, v, ranges, o, lse)`."""

    def call(q, k, v, ranges, *, scale=None, positions=None):
        o, lse = attend(q, k, v, ranges, scale=scale, positions=positions)
        return fix(q, k, v, ranges, o, lse)

    return call


class _TouchAllKeys(torch.autograd.Function):
    """Identity on k whose backward adds 1e-7 to every key's gradient (a dense dk pass)."""

    @staticmethod
    def forward(ctx, k):
        return k.clone()

    @staticmethod
    def backward(ctx, g):
        return g + 1e-7


class _GradTimes(torch.autograd.Function):
    """Identity whose backward multiplies the gradient by `factor`."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * ctx.factor, None


def _dq_unscaled(q, k, v, ranges, *, scale=None, positions=None):
    """dq misses the softmax scale: it comes out sqrt(Dk) times too large."""
    return attend(_GradTimes.apply(q, math.sqrt(q.shape[-1])), k, v, ranges, scale=scale, positions=positions)


def _dense_dk(q, k, v, ranges, *, scale=None, positions=None):
    return attend(q, _TouchAllKeys.apply(k), v, ranges, scale=scale, positions=positions)


def _wobbling(grad: bool):
    """One ulp added on every other call: to o (forward) or, through autograd, to dk."""
    calls = itertools.count()

    class _Wobble(torch.autograd.Function):
        @staticmethod
        def forward(ctx, k):
            return k.clone()

        @staticmethod
        def backward(ctx, g):
            return torch.nextafter(g, torch.full_like(g, math.inf)) if next(calls) % 2 else g

    def call(q, k, v, ranges, *, scale=None, positions=None):
        if grad:
            return attend(q, _Wobble.apply(k), v, ranges, scale=scale, positions=positions)
        o, lse = attend(q, k, v, ranges, scale=scale, positions=positions)
        return (torch.nextafter(o, torch.full_like(o, math.inf)) if next(calls) % 2 else o), lse

    return call


def _reused_buffer():
    """One output buffer handed back on every call (as a CUDA-graph kernel has), its values one
    ulp off on every other call: comparing two calls' outputs without a copy compares the
    buffer with itself."""
    calls = itertools.count()
    buffers = {}

    def call(q, k, v, ranges, *, scale=None, positions=None):
        o, lse = attend(q, k, v, ranges, scale=scale, positions=positions)
        if next(calls) % 2:
            o = torch.nextafter(o, torch.full_like(o, math.inf))
        out = buffers.setdefault((o.shape, o.dtype, o.device), torch.empty_like(o))
        with torch.no_grad():
            out.copy_(o)
        return out, lse

    return call


class _AtomicGather(torch.autograd.Function):
    """Rows `idx` of `x` [N, D]; the backward sums each row's gradient terms with index_add_ in
    fp32, which on CUDA adds with atomics in an order that changes from run to run."""

    @staticmethod
    def forward(ctx, x, idx):
        ctx.save_for_backward(idx)
        ctx.shape, ctx.dtype = x.shape, x.dtype
        return x.index_select(0, idx)

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        acc = torch.zeros(ctx.shape, dtype=torch.float32, device=g.device).index_add_(0, idx, g.float())
        return acc.to(ctx.dtype), None


def _atomic_dk_dv(q, k, v, ranges, *, scale=None, positions=None):
    """Correct values; dk and dv accumulated with atomics (SPEC.md: determinism)."""
    check_inputs(q, k, v, ranges, scale=scale, positions=positions)
    B, S, G, h, Dk = q.shape
    S_kv = k.shape[2]
    nr = normalize_ranges(ranges.to(torch.int64), S_kv, positions)
    idx, valid = expand_ranges(nr, max(int(selected_lengths(nr).max()), 1))
    row = torch.arange(B, device=q.device)[:, None, None, None] * G + torch.arange(G, device=q.device)[None, None, :, None]
    flat = (row * S_kv + idx).reshape(-1)
    ks = _AtomicGather.apply(k.reshape(B * G * S_kv, Dk), flat).reshape(*idx.shape, Dk)
    vs = _AtomicGather.apply(v.reshape(B * G * S_kv, v.shape[3]), flat).reshape(*idx.shape, v.shape[3])
    o, lse = gather_rows(q, ks, vs, valid, resolve_scale(scale, Dk), torch.float64)
    return o.to(v.dtype), lse.to(torch.promote_types(q.dtype, torch.float32))


def atomic_dk_dv(q, k, v, ranges, *, scale=None):
    """The atomic-backward known-bad as an outside kernel, for `selgate check
    selgate.conformance.badimpls:atomic_dk_dv` (its declarations are its attributes)."""
    return _atomic_dk_dv(q, k, v, ranges, scale=scale)


atomic_dk_dv.lse = True
atomic_dk_dv.backward = True


def _rolled_heads(q, k, v, ranges, *, scale=None, positions=None):
    """Odd heads read the next group's ranges (a head-to-group index bug)."""
    o, lse = attend(q, k, v, ranges, scale=scale, positions=positions)
    o2, lse2 = attend(q, k, v, ranges.roll(1, dims=2), scale=scale, positions=positions)
    odd = torch.arange(q.shape[3], device=q.device) % 2 == 1
    return torch.where(odd[:, None], o2, o), torch.where(odd, lse2, lse)


def _decode_drops_newest(q, k, v, ranges, *, scale=None, positions=None):
    """Decode (S == 1) computes t = S_kv - 2: the newest key is never read."""
    if q.shape[1] == 1 and positions is None:
        positions = torch.full((q.shape[0], 1), k.shape[2] - 2, device=q.device)
    return attend(q, k, v, ranges, scale=scale, positions=positions)


def _unwritten_empty_rows(q, k, v, ranges, *, scale=None, positions=None):
    """Empty rows are never written: o comes from torch.empty (caught where outputs can be
    poisoned before the call, i.e. on CUDA)."""
    o, lse = attend(q, k, v, ranges, scale=scale, positions=positions)
    out = torch.empty_like(o)
    written = torch.isfinite(lse)
    out[written] = o[written]
    return out, lse


def _int32_inclusive(q, k, v, ranges, *, scale=None, positions=None):
    """int32 ranges are read as inclusive of their end."""
    if ranges.dtype == torch.int32:
        ranges = ranges + torch.tensor([0, 1], dtype=torch.int32, device=ranges.device)
    return attend(q, k, v, ranges, scale=scale, positions=positions)


def _unchecked(q, k, v, ranges, *, scale=None, positions=None):
    """No input validation: float ranges, NaN scale and mismatched shapes are used as given."""
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return attend(q.float(), k.float(), v.float(), ranges.to(torch.int64), scale=sc, positions=positions, check=False)


def _dense_rows(q, k, v, ranges, *, scale=None, positions=None):
    """K and V made contiguous only when their last stride is not 1, then row r addressed at
    r * D, as a kernel that trusts its inner stride would: rows of a shared buffer go astray."""
    k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
    k, v = (t.as_strided(t.shape, torch.empty(t.shape, device="meta").stride()) for t in (k, v))
    return attend(q, k, v, ranges, scale=scale, positions=positions)


def _varlen(call):
    def varlen(q, k, v, ranges, cu_q, cu_k, *, scale=None):
        glob, pos = varlen_to_batched(ranges, cu_q, cu_k)
        return call(q, k, v, glob, scale=scale, positions=pos)

    return varlen


def _varlen_unshifted(q, k, v, ranges, cu_q, cu_k, *, scale=None):
    """Sequence-local ranges used as packed ones: every sequence reads the first one's keys."""
    _, pos = varlen_to_batched(ranges, cu_q, cu_k)
    return attend(q, k, v, ranges, scale=scale, positions=pos)


def _dense_mask(q, k, v, ranges, *, scale=None, positions=None):
    """The reference's dense-mask formulation: every key is read, unselected ones with weight 0."""
    o, lse = selection_attention_ref(q, k, v, ranges, scale=scale, positions=positions, return_lse=True, formulation="mask")
    return o.to(v.dtype), lse.float()


def _causal_unless_a_multiple_of_64(B, S, S_kv):
    """Query positions, but t = S_kv - 1 for every row where S_kv is a multiple of 64 (a fast path
    for whole tiles that drops the causal limit)."""
    t = torch.arange(S) + S_kv - S
    return (torch.full_like(t, S_kv - 1) if S_kv % 64 == 0 else t).expand(B, S)


def _last_tile_by_remainder(idx, valid):
    """The last 64-key tile of a row masked by `pos % 64 < L % 64`: a row of exactly 64k keys
    loses its last tile."""
    L = valid.sum(-1, keepdim=True)
    pos = _pos_in_row(idx)
    last = torch.div(L - 1, 64, rounding_mode="floor") * 64
    return idx, valid & ((pos < last) | (pos % 64 < L % 64))


def _heads_past_16_dropped(q, k, v, ranges, o, lse):
    """One program of 16 heads a group: heads 16 and on are never written (zero, lse -inf)."""
    o, lse = o.clone(), lse.clone()
    o[..., 16:, :] = 0
    lse[..., 16:] = float("-inf")
    return o, lse


def _dims_past_16_ignored(q, k, v, ranges, *, scale=None, positions=None):
    """A kernel of one 16-wide head-dim tile: dims past 16 never enter q.k (no error)."""
    return attend(q[..., :16], k[..., :16], v, ranges, scale=resolve_scale(scale, q.shape[-1]), positions=positions)


def _one_query_at_position_0(q, k, v, ranges, *, scale=None, positions=None):
    """SPEC.md's first listed mistake: a prefill kernel given one query puts it at position 0
    (SDPA's `is_causal=True` with one query), so it attends to key 0 alone."""
    if q.shape[1] == 1 and positions is None:
        positions = torch.zeros(q.shape[:2], dtype=torch.int64, device=q.device)
    return attend(q, k, v, ranges, scale=scale, positions=positions)


def _max_from_zero(q, k, v, ranges, *, scale=None, positions=None):
    """The running max initialised at 0 rather than -inf: rows whose scores all lie below about
    -104 underflow exp() to 0 / 0."""
    offset = lambda s: s.amax(-1, keepdim=True).clamp(min=0)  # noqa: E731
    return attend(q, k, v, ranges, scale=scale, positions=positions, rows=_fp32_softmax(offset))


def _dk_dv_from_first_64_rows(q, k, v, ranges, *, scale=None, positions=None):
    """The dk/dv pass loops over one block of 64 query rows: later rows add nothing to dk, dv
    (the forward and dq are right)."""
    o, lse = attend(q, k, v, ranges, scale=scale, positions=positions)
    o_q, lse_q = attend(q, k.detach(), v.detach(), ranges, scale=scale, positions=positions)
    first = (torch.arange(q.shape[1], device=q.device) < 64)[None, :, None, None]
    return torch.where(first[..., None], o, o_q), torch.where(first, lse, lse_q)


def _second_dim_chunk_reread(q, k, v, ranges, *, scale=None, positions=None):
    """Head dims past 192 in chunks of 128 whose second chunk re-reads dims 0.. (right up to 192)."""
    Dk = q.shape[-1]
    if Dk > 192:
        q, k = (torch.cat([t[..., :128], t[..., : Dk - 128]], -1) for t in (q, k))
    return attend(q, k, v, ranges, scale=scale, positions=positions)


def _split_k_empty_split(q, k, v, ranges, o, lse):
    """Decode past 1024 keys in splits of 256 whose combine divides 0 by 0 for a split that
    selects no key: such rows come back NaN."""
    S_kv = k.shape[2]
    if q.shape[1] != 1 or S_kv < 1024:
        return o, lse
    nr = normalize_ranges(ranges.to(torch.int64), S_kv)
    idx, valid = expand_ranges(nr, max(int(selected_lengths(nr).max()), 1))
    splits = -(-S_kv // 256)
    hit = torch.zeros(*idx.shape[:-1], splits + 1, dtype=torch.bool, device=q.device)  # the last: unselected
    hit.scatter_(-1, torch.where(valid, torch.div(idx, 256, rounding_mode="floor"), splits), True)
    broken = ~hit[..., :splits].all(-1)[..., None]
    return torch.where(broken[..., None], float("nan"), o), torch.where(broken, float("nan"), lse)


@dataclass(frozen=True)
class BadImpl:
    """A known-bad implementation and the family that must flag it."""

    impl: Impl
    caught_by: str
    bug: str
    device: str = "cpu"  # where the self-test runs it
    aimed_at: str = ""  # a part of the ids of the cases made for this bug: the self-test tries them first


def _bad(name, call, caught_by, bug, varlen=None, device="cpu", aimed_at="", **declared):
    """`declared`: Impl fields that narrow what it claims, as the kernel that shipped the bug
    declared them (so the matrix of before missed it)."""

    def wrapped(q, k, v, ranges, *, scale=None, want_lse=True):
        return call(q, k, v, ranges, scale=scale)

    fields = {"dtypes": ALL_DTYPES, "varlen": varlen or _varlen(call), "backward": True, "lse": True, **declared}
    impl = Impl(name, wrapped, **fields)
    return BadImpl(impl, caught_by, bug, device, aimed_at)


def seeded_by_pid(q, k, v, ranges, *, scale=None, positions=None):
    """Correct but for one ulp added to the outputs a generator seeded by the process id picks:
    bitwise repeatable within a process, different in every other (a kernel seeded by its pid,
    or tuned per process). Module-level, so a second process loads it by name."""
    o, lse = attend(q, k, v, ranges, scale=scale, positions=positions)
    picked = torch.rand(o.shape, generator=torch.Generator().manual_seed(os.getpid())) < 0.5
    return torch.where(picked.to(o.device), torch.nextafter(o, torch.full_like(o, math.inf)), o), lse


def _keys(fn):
    return lambda q, k, v, r, *, scale=None, positions=None: attend(q, k, v, r, scale=scale, positions=positions, keys=fn)


def _pos_in_row(idx):
    return torch.arange(idx.shape[-1], device=idx.device)


BAD_IMPLS = (
    _bad(
        "first-key-only",
        _keys(lambda i, m: (i, m & (_pos_in_row(i) == 0))),
        "parity",
        "softmax over the first selected key only (SDPA with one query and is_causal=True)",
    ),
    _bad(
        "reads-beyond-t",
        _normalised_by(_positions(lambda B, S, S_kv: torch.full((B, S), S_kv - 1))),
        "parity",
        "ranges clamped to S_kv but not to t + 1",
    ),
    _bad("overlap-counted-twice", _overlap_twice, "parity", "overlapping ranges concatenated, not merged"),
    _bad(
        "pv-over-shared-keys",
        _pv_over_shared_keys,
        "bounds",
        "P.V over the keys any row of the group selects: NaN in V at one row's key reaches the others",
    ),
    _bad(
        "scale-1-over-Dk",
        lambda q, k, v, r, *, scale=None, positions=None: attend(
            q, k, v, r, scale=scale, positions=positions, scale_of=lambda s, Dk: 1.0 / Dk if s is None else s
        ),
        "parity",
        "default scale 1/Dk instead of 1/sqrt(Dk)",
    ),
    _bad(
        "nan-on-empty-rows",
        _with_output(lambda q, k, v, r, o, lse: (torch.where(torch.isinf(lse)[..., None], torch.nan, o).to(o.dtype), lse)),
        "empty_ranges",
        "empty rows divide 0 by 0",
    ),
    _bad(
        "empty-rows-lse-zero",
        _with_output(lambda q, k, v, r, o, lse: (o, torch.where(torch.isinf(lse), 0.0, lse))),
        "empty_ranges",
        "empty rows report lse = 0 instead of -inf",
    ),
    _bad("one-ulp-wobble", _wobbling(grad=False), "determinism", "o differs by one ulp on every other run"),
    _bad("dk-wobble", _wobbling(grad=True), "determinism_backward", "dk accumulated in a run-dependent order (atomics)"),
    _bad(
        "seeded-by-pid",
        seeded_by_pid,
        "determinism",
        "bitwise repeatable within a process, different in every process (seeded by its pid)",
        spec="selgate.conformance.badimpls:seeded_by_pid",
    ),
    _bad(
        "reused-output-buffer", _reused_buffer(), "determinism", "one output buffer for every call, values differing run to run"
    ),
    _bad(
        "atomic-dk-dv",
        _atomic_dk_dv,
        "determinism_backward",
        "dk and dv accumulated with atomics (index_add_ on CUDA): the order of the sum changes run to run",
        device="cuda",
    ),
    _bad("dense-dk", _dense_dk, "backward", "dk written for keys no row selected"),
    _bad("dq-missing-scale", _dq_unscaled, "gradcheck", "dq not multiplied by the softmax scale"),
    _bad(
        "first-tile-only",
        _keys(lambda i, m: (i, m & (_pos_in_row(i) < FIRST_TILE))),
        "parity",
        f"tile loop stops after the first BLOCK_L={FIRST_TILE} keys",
    ),
    _bad(
        "lse-off-by-log2",
        _with_output(lambda q, k, v, r, o, lse: (o, lse + math.log(2))),
        "parity",
        "lse in the wrong base / off by log(2)",
    ),
    _bad(
        "queries-at-start",
        lambda q, k, v, r, *, scale=None, positions=None: attend(
            q, k, v, r, scale=scale, norm=_positions(lambda B, S, S_kv: torch.arange(S).expand(B, S))
        ),
        "parity",
        "query s placed at t = s instead of s + S_kv - S",
    ),
    _bad("heads-read-other-group", _rolled_heads, "group", "odd heads use the next group's ranges"),
    _bad("decode-drops-newest-key", _decode_drops_newest, "decode", "decode computes t = S_kv - 2"),
    _bad(
        "fp32-output", _with_output(lambda q, k, v, r, o, lse: (o.float(), lse)), "dtype", "o returned in fp32 whatever v's dtype"
    ),
    _bad(
        "fp64-output-on-int32-ranges",
        _with_output(lambda q, k, v, r, o, lse: (o.double() if r.dtype == torch.int32 else o, lse)),
        "dtype",
        "o returned in fp64 when the ranges are int32 (a cast forgotten on one path)",
    ),
    _bad("int32-ranges-inclusive", _int32_inclusive, "dtype", "int32 ranges read as inclusive of their end"),
    _bad(
        "kv-rows-assumed-dense",
        _dense_rows,
        "dtype",
        "k, v rows addressed at row * D whatever their row stride (K and V sharing one buffer)",
    ),
    _bad("no-input-checks", _unchecked, "bad_input", "malformed input used as given, no error"),
    _bad("dense-mask-times-zero", _dense_mask, "bounds", "unselected keys read and multiplied by a zero weight (NaN * 0 = NaN)"),
    _bad(
        "varlen-dense-mask-times-zero",
        _dense_mask,
        "varlen",
        "packed sequences: unselected keys, other sequences' included, read with a zero weight",
    ),
    _bad(
        "lse-rounded-to-input-dtype",
        _with_output(lambda q, k, v, r, o, lse: (o, lse.to(q.dtype).to(lse.dtype))),
        "parity",
        "lse rounded through the input dtype (it is fp32 whatever the inputs); caught in bf16, while "
        "fp16's rounding stays within SPEC.md's 1e-3 mean bound",
    ),
    _bad(
        "unwritten-empty-rows",
        _unwritten_empty_rows,
        "empty_ranges",
        "o allocated with torch.empty, empty rows never written",
        device="cuda",
    ),
    _bad(
        "varlen-unshifted-ranges",
        attend,
        "varlen",
        "local ranges not shifted by the sequence's key offset",
        varlen=_varlen_unshifted,
    ),
    _bad(
        "every-group-reads-group-0",
        _group_zero_keys,
        "parity",
        "every KV group reads group 0's keys; declares fp32, decode, head dims <= 8 (which left only G = 1)",
        dtypes=("fp32",),
        modes=("decode",),
        max_head_dim=8,
    ),
    _bad(
        "heads-to-group-by-shift",
        _heads_by_shift,
        "parity",
        "head-to-group index j >> log2(h): wrong when h is not a power of two; declares h a multiple of 2",
        heads_multiple_of=2,
    ),
    _bad(
        "groups-padded-to-power-of-two",
        _groups_padded,
        "parity",
        "K/V batch stride of G rounded up to a power of two: wrong when G is not one",
    ),
    _bad(
        "head-dim-rounded-down",
        _head_dim_rounded_down,
        "parity",
        "scores over the first 2^floor(log2 Dk) dims: wrong when Dk is not a power of two; declares head dims <= 128",
        max_head_dim=128,
    ),
    _bad(
        "softmax-without-max",
        _no_max,
        "parity",
        "exp(s) / sum exp(s) without subtracting the row max: overflows past s = 88.7; declares fp32",
        dtypes=("fp32",),
    ),
    _bad(
        "max-shared-by-group",
        _group_max,
        "parity",
        "one softmax max per group tile, shared by its heads: heads with small scores underflow",
    ),
    _bad(
        f"tile-loop-stops-after-{TILES_READ}",
        _keys(lambda i, m: (i, m & (_pos_in_row(i) < TILES_READ))),
        "parity",
        f"tile loop stops after {TILES_READ} keys (no tiny row had more)",
    ),
    _bad(
        "ignores-k-storage-offset",
        _ignores_k_offset,
        "dtype",
        "k read from its storage's start while declaring the strided layout (k = cache[1:] reads cache[0])",
    ),
    _bad(
        "int32-batch-offsets",
        _int32_batch_offsets,
        "dtype",
        "K/V batch offsets in int32: batches 2^31 elements apart read another batch (a long context's T * heads * D)",
        device="cuda",
    ),
    _bad(
        "int32-batch-offsets-in-backward",
        _backward_by(reads=_int32_wrapped),  # q's offsets never reach 2^31 elements: unchanged
        "dtype",
        "the backward's K/V batch offsets in int32 (the forward's are 64-bit): batches 2^31 elements apart get wrong gradients",
        device="cuda",
    ),
    _bad(
        "query-block-offset-dropped",
        _normalised_by(_positions(lambda B, S, S_kv: (torch.arange(S) % 64 + S_kv - S).expand(B, S))),
        "parity",
        "query position from s % 64 (a query block's offset dropped): right while S <= 64",
        aimed_at="S80Skv128",
    ),
    _bad(
        "causality-dropped-at-multiples-of-64",
        _normalised_by(_positions(_causal_unless_a_multiple_of_64)),
        "parity",
        "keys limited by S_kv, not t + 1, where S_kv is a multiple of 64 (no tiny S_kv was)",
        aimed_at="S80Skv128",
    ),
    _bad(
        "first-8-ranges-only",
        _normalised_by(lambda r, S_kv, p: normalize_ranges(r[..., :8, :], S_kv, p)),
        "parity",
        "a fixed buffer of 8 ranges a row (tiny rows had at most 6)",
        aimed_at="S80Skv128",
    ),
    _bad(
        "last-tile-by-remainder",
        _keys(_last_tile_by_remainder),
        "parity",
        "last tile masked by L % 64 (64k keys: lost)",
        aimed_at="S80Skv128",
    ),
    _bad(
        "heads-past-16-dropped",
        _with_output(_heads_past_16_dropped),
        "parity",
        "one 16-head block a group: h > 16 unwritten",
        aimed_at="Skv1030",
    ),
    _bad(
        "heads-past-16-dropped-beyond-declared",
        _with_output(_heads_past_16_dropped),
        "limits",
        "declares 8 heads a group and answers beyond them, right up to 16 and with h > 16 unwritten, without an error",
        max_heads=8,
    ),
    _bad(
        "head-dims-past-declared-ignored",
        _dims_past_16_ignored,
        "limits",
        "declares head dims up to 16 and answers beyond them from the first 16 dims, without an error",
        max_head_dim=16,
    ),
    _bad(
        "decode-beyond-declared-prefill",
        _one_query_at_position_0,
        "limits",
        "declares prefill only and answers a decode call from position 0, without an error",
        modes=("prefill",),
    ),
    _bad(
        "max-from-zero",
        _max_from_zero,
        "parity",
        "running max initialised at 0: rows of scores below -104 give 0 / 0; declares fp32",
        dtypes=("fp32",),
        aimed_at="vlarge_logits",
    ),
    _bad(
        "dk-dv-from-first-64-rows",
        _dk_dv_from_first_64_rows,
        "backward",
        "dk/dv loop over one 64-row block only",
        aimed_at="S80Skv128",
    ),
    _bad(
        "second-dim-chunk-reread",
        _second_dim_chunk_reread,
        "parity",
        "second 128-dim chunk re-reads dims 0.. (Dk > 192)",
        aimed_at="D256x256",
    ),
    _bad(
        "tile-loop-stops-after-512",
        _keys(lambda i, m: (i, m & (_pos_in_row(i) < 512))),
        "parity",
        "at most 512 keys a row",
        aimed_at="Skv1030",
    ),
    _bad(
        "split-k-empty-split-nan",
        _with_output(_split_k_empty_split),
        "parity",
        "decode past 1024 keys in 256-key splits: a split that selects nothing gives 0 / 0",
        aimed_at="Skv1030",
    ),
    _bad("normalises-ranges-in-place", _normalises_in_place, "parity", "writes the normalised ranges into the caller's tensor"),
    _bad(
        "backward-without-max",
        _backward_by(rows=_fp32_softmax(lambda s: torch.zeros_like(s[..., :1]))),
        "backward",
        "the forward right, a backward that recomputes the softmax without the row max: NaN gradients at scores near 100",
        dtypes=("fp32",),
        aimed_at="vlarge_logits",
    ),
    _bad("dq-scaled-by-dv", _dq_scaled_by_dv, "backward", "dq scaled with 1/sqrt(Dv): wrong only when Dv != Dk"),
)
