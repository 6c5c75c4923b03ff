"""Triton forward of NSA selection attention: group-centric, one program per (b, s, g).

Why this schedule: the h heads of a KV group share their ranges (SPEC.md), so a program
loads q for the whole group once and reuses every K/V tile for all of its heads through
`tl.dot` (heads padded to 16 rows, the MMA minimum).

The tile loop walks the row's ranges in order, BLOCK_L selected keys at a time: tile
positions count keys over the concatenation of the row's ranges, and each position maps
to `start of its range + offset` in registers. NSA ranges are mostly single 64-key blocks;
a nested range-then-tile loop would make each inner loop one iteration long, which the
software pipeliner cannot overlap, while this flat loop prefetches the next tile across
range boundaries. Every load is masked by its range's end and by `t`, so no key outside
the selection is read, and the loop bound `L` is computed on the device (no host sync).

With `TMA` (Hopper; the H100 profile turns it on for prefill) whole BLOCK_L-key tiles of
each range are loaded through tensor descriptors instead: the copy engine computes the
addresses, so the SMs skip the per-key address arithmetic and masks, and such a tile
holds only selected keys. Each range's remainder still takes the masked gather path in
TAIL_L tiles. Measured on the H100, prefill T=65536: 16.5 ms against 17.4 ms for the
gather path (rotating inputs), 16.6 against 21.2 ms with L2 flushed before each call.

With `PAIRS` (the H100 profile's prefill) calls that pairs.py supports go to its Gluon kernel
instead, which serves two neighbouring rows a program and loads the tiles both select once.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from selgate.device import device_capability
from selgate.kernels.policy import interpreting
from selgate.kernels.triton_limits import TMA_MIN_CAPABILITY
from selgate.kernels.stats import record_launch

from . import tuning
from .launch import bind, launch
from .tiles import MIN_DOT, block_key, gather_keys, pow2_at_least

LOG2E = 1.4426950408889634
INT32_MAX = 2**31 - 1  # larger S_kv compiles the kernel with 64-bit key counts (KEY64)


@triton.jit
def _softmax_step(q, kt, vt, ok, m_i, l_i, acc, qk_scale, IEEE: tl.constexpr, MASKED: tl.constexpr):
    """One online-softmax step: kt [DK_PAD, keys], vt [keys, DV_PAD]; `ok` masks keys when MASKED."""
    if IEEE:
        sc = tl.dot(q, kt, input_precision="ieee")
    else:
        sc = tl.dot(q, kt)
    if MASKED:
        sc = tl.where(ok[None, :], sc * qk_scale, float("-inf"))
    else:
        sc = sc * qk_scale
    m_new = tl.maximum(m_i, tl.max(sc, 1))  # finite: every tile holds >= 1 selected key
    alpha = tl.exp2(m_i - m_new)
    pr = tl.exp2(sc - m_new[:, None])
    l_i = l_i * alpha + tl.sum(pr, 1)
    if IEEE:
        pv = tl.dot(pr, vt, input_precision="ieee")
    else:
        pv = tl.dot(pr.to(vt.dtype), vt)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _attend_tile(
    q,
    k_grp,
    v_grp,
    sk_n,
    sv_n,
    p0,
    start,
    first,
    stop,
    L,
    lim,
    Dk,
    Dv,
    m_i,
    l_i,
    acc,
    qk_scale,
    IEEE: tl.constexpr,
    DK_PAD: tl.constexpr,
    DV_PAD: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    """Tile positions [p0, p0 + BLOCK_L) of the row's selection, gathered with masked loads."""
    dk = tl.arange(0, DK_PAD)
    dv = tl.arange(0, DV_PAD)
    key, ok = gather_keys(p0, start, first, stop, L, lim, BLOCK_L)
    kt = tl.load(k_grp + key[None, :] * sk_n + dk[:, None], mask=ok[None, :] & (dk[:, None] < Dk), other=0.0)
    vt = tl.load(v_grp + key[:, None] * sv_n + dv[None, :], mask=ok[:, None] & (dv[None, :] < Dv), other=0.0)
    return _softmax_step(q, kt, vt, ok, m_i, l_i, acc, qk_scale, IEEE, True)


@triton.jit
def _attend_ranges(
    q,
    k_grp,
    v_grp,
    sk_n,
    sv_n,
    start,
    length,
    lim,
    Dk,
    Dv,
    m_i,
    l_i,
    acc,
    qk_scale,
    IEEE: tl.constexpr,
    DK_PAD: tl.constexpr,
    DV_PAD: tl.constexpr,
    TILE: tl.constexpr,
):
    """Every key of the ranges `[start, start + length)` in TILE-position gather tiles."""
    stop = tl.cumsum(length, 0)
    first = stop - length
    L = tl.sum(length, 0)
    for p0 in tl.range(0, L, TILE):
        m_i, l_i, acc = _attend_tile(
            q,
            k_grp,
            v_grp,
            sk_n,
            sv_n,
            p0,
            start,
            first,
            stop,
            L,
            lim,
            Dk,
            Dv,
            m_i,
            l_i,
            acc,
            qk_scale,
            IEEE,
            DK_PAD,
            DV_PAD,
            TILE,
        )
    return m_i, l_i, acc


@triton.jit
def _attend_block(
    q,
    k_desc,
    v_desc,
    b,
    g,
    i,
    j,
    start,
    nfull,
    cum,
    m_i,
    l_i,
    acc,
    qk_scale,
    IEEE: tl.constexpr,
    DK_PAD: tl.constexpr,
    DV_PAD: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    """Whole tile `i` of the row: BLOCK_L selected keys through the tensor descriptors, unmasked."""
    key0 = block_key(i, j, start, nfull, cum, BLOCK_L)
    kt = tl.reshape(k_desc.load([b, g, key0, 0]), (BLOCK_L, DK_PAD))
    vt = tl.reshape(v_desc.load([b, g, key0, 0]), (BLOCK_L, DV_PAD))
    return _softmax_step(q, tl.trans(kt), vt, 0, m_i, l_i, acc, qk_scale, IEEE, False)


@triton.jit
def _attend_blocks(
    q,
    k_desc,
    v_desc,
    b,
    g,
    j,
    start,
    nfull,
    m_i,
    l_i,
    acc,
    qk_scale,
    IEEE: tl.constexpr,
    DK_PAD: tl.constexpr,
    DV_PAD: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    """The `nfull` whole BLOCK_L-key tiles of every range, one tensor-descriptor load each."""
    cum = tl.cumsum(nfull, 0)
    F = tl.sum(nfull, 0)
    for i in tl.range(0, F):
        m_i, l_i, acc = _attend_block(
            q, k_desc, v_desc, b, g, i, j, start, nfull, cum, m_i, l_i, acc, qk_scale, IEEE, DK_PAD, DV_PAD, BLOCK_L
        )
    return m_i, l_i, acc


# Integer arguments whose values only size loops or address q, o, lse and the ranges once
# per program: specialising on them (value 1, divisibility by 16) would compile one kernel
# per shape. K/V strides and head dims stay specialised: they make the K/V loads vector loads.
_VARYING = (
    "sq_b",
    "sq_s",
    "sq_g",
    "sq_h",
    "sr_b",
    "sr_s",
    "sr_g",
    "sr_j",
    "so_b",
    "so_s",
    "so_g",
    "so_h",
    "sl_b",
    "sl_s",
    "sl_g",
    "sl_h",
    "S",
    "G",
    "S_kv",
    "h",
    "n",
    "kv_bytes",
)


@triton.jit(do_not_specialize=_VARYING)
def _sel_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    k_desc,
    v_desc,
    r_ptr,
    pos_ptr,
    o_ptr,
    lse_ptr,
    count_ptr,
    sq_b,
    sq_s,
    sq_g,
    sq_h,
    sk_b,
    sk_g,
    sk_n,
    sv_b,
    sv_g,
    sv_n,
    sr_b,
    sr_s,
    sr_g,
    sr_j,
    so_b,
    so_s,
    so_g,
    so_h,
    sl_b,
    sl_s,
    sl_g,
    sl_h,
    S,
    G,
    S_kv,
    h,
    Dk,
    Dv,
    n,
    qk_scale,
    kv_bytes,
    HAS_POS: tl.constexpr,
    IEEE: tl.constexpr,
    H_PAD: tl.constexpr,
    DK_PAD: tl.constexpr,
    DV_PAD: tl.constexpr,
    N_PAD: tl.constexpr,
    BLOCK_L: tl.constexpr,
    TMA: tl.constexpr,
    TAIL_L: tl.constexpr,
    KEY64: tl.constexpr,
    CLIP: tl.constexpr,
    COUNT: tl.constexpr,
):
    # Rows run in (b, g, s) order: neighbouring programs share one group's K/V in L2.
    pid = tl.program_id(0).to(tl.int64)
    s = pid % S
    g = (pid // S) % G
    b = pid // (S * G)
    if HAS_POS:
        t = tl.load(pos_ptr + b * S + s)
    else:
        t = s + S_kv - S
    lim = tl.minimum(tl.maximum(t + 1, 0), S_kv)  # keys >= lim are never read

    # The row's ranges, clamped to [0, lim); start/stop of each range in tile positions.
    j = tl.arange(0, N_PAD)
    r_row = r_ptr + b * sr_b + s * sr_s + g * sr_g + j * sr_j
    # Clamped in 64 bits, then narrowed: int64 ranges as a caller gives them (CLIP) may hold
    # values past 2^31 (an "up to the end" marker), whose low 32 bits would select other keys.
    lim = lim.to(tl.int64)
    start = tl.minimum(tl.maximum(tl.load(r_row, mask=j < n, other=0).to(tl.int64), 0), lim)
    end = tl.minimum(tl.maximum(tl.load(r_row + 1, mask=j < n, other=0).to(tl.int64), 0), lim)
    if not KEY64:  # S_kv < 2^31: key counts fit int32
        lim, start, end = lim.to(tl.int32), start.to(tl.int32), end.to(tl.int32)
    if CLIP:
        # Ranges as the caller gave them (any order, overlaps allowed): each range drops the
        # keys below the furthest end of the ranges before it in (start, slot) order. Those
        # keys are that range's, so every key of the union counts once, in one range.
        i = tl.arange(0, N_PAD)
        before = (start[None, :] < start[:, None]) | ((start[None, :] == start[:, None]) & (i[None, :] < i[:, None]))
        start = tl.maximum(start, tl.max(tl.where(before, end[None, :], 0), 1))
    length = tl.maximum(end - start, 0)
    if COUNT:  # the call's selected tokens and K/V bytes, one pair of adds per row
        L = tl.sum(length.to(tl.int64), 0)
        tl.atomic_add(count_ptr, L)
        tl.atomic_add(count_ptr + 1, L * kv_bytes)

    hh = tl.arange(0, H_PAD)
    dk = tl.arange(0, DK_PAD)
    dv = tl.arange(0, DV_PAD)
    q_rows = q_ptr + b * sq_b + s * sq_s + g * sq_g + hh[:, None].to(tl.int64) * sq_h
    q = tl.load(q_rows + dk[None, :], mask=(hh[:, None] < h) & (dk[None, :] < Dk), other=0.0)
    k_grp = k_ptr + b * sk_b + g * sk_g
    v_grp = v_ptr + b * sv_b + g * sv_g

    m_i = tl.full([H_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([H_PAD], tl.float32)
    acc = tl.zeros([H_PAD, DV_PAD], tl.float32)
    if TMA:
        # Whole BLOCK_L-key tiles of every range come through the tensor-memory accelerator:
        # no per-key address arithmetic and no masks, and every key they hold is selected.
        # Only each range's remainder (< BLOCK_L keys) takes the masked gather path below.
        nfull = length // BLOCK_L
        m_i, l_i, acc = _attend_blocks(
            q,
            k_desc,
            v_desc,
            b.to(tl.int32),
            g.to(tl.int32),
            j,
            start,
            nfull,
            m_i,
            l_i,
            acc,
            qk_scale,
            IEEE,
            DK_PAD,
            DV_PAD,
            BLOCK_L,
        )
        m_i, l_i, acc = _attend_ranges(
            q,
            k_grp,
            v_grp,
            sk_n,
            sv_n,
            start + nfull * BLOCK_L,
            length - nfull * BLOCK_L,
            lim,
            Dk,
            Dv,
            m_i,
            l_i,
            acc,
            qk_scale,
            IEEE,
            DK_PAD,
            DV_PAD,
            TAIL_L,
        )
    else:
        m_i, l_i, acc = _attend_ranges(
            q,
            k_grp,
            v_grp,
            sk_n,
            sv_n,
            start,
            length,
            lim,
            Dk,
            Dv,
            m_i,
            l_i,
            acc,
            qk_scale,
            IEEE,
            DK_PAD,
            DV_PAD,
            BLOCK_L,
        )

    nonempty = l_i != 0  # NaN (a NaN or infinite score) is not empty: lse and o stay NaN
    l_safe = tl.where(nonempty, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse = tl.where(nonempty, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    o_rows = o_ptr + b * so_b + s * so_s + g * so_g + hh[:, None].to(tl.int64) * so_h
    tl.store(o_rows + dv[None, :], o.to(o_ptr.dtype.element_ty), mask=(hh[:, None] < h) & (dv[None, :] < Dv))
    tl.store(lse_ptr + b * sl_b + s * sl_s + g * sl_g + hh * sl_h, lse, mask=hh < h)


def launch_config(Dk: int, Dv: int, item: int, kind: str, *, dtype=None, S_kv=None, n=None, tune=None) -> dict:
    """BLOCK_L, num_warps, num_stages, TMA and TAIL_L for one call of `kind` ("decode",
    "prefill" or "interpreter", whose small tiles make tiny test rows span several tiles).
    TMA comes from `triton_fwd.<kind>.tma` (env SELGATE_TRITON_TMA); such a kind skips tuned
    entries, which time the gather path. PAIRS (pairs.py's kernel where it applies) comes
    from `triton_fwd.<kind>.pairs` (env SELGATE_TRITON_PAIRS).

    Chosen by `tuning.fwd_config`, cached per (kind, Dk, Dv, L bucket of (S_kv, n), dtype):
    env `SELGATE_TRITON_FWD_CONFIG` > persisted tuned config (`configs/tuned/`) > the
    profile's `triton_fwd.by_L_bucket.<kind>` > `triton_fwd.<kind>` (`configs/`); profile
    values shrink until the pipelined K/V tiles fit `triton_fwd.smem_budget_kb`. Without
    `dtype`, `S_kv` and `n` only the profile's `triton_fwd.<kind>` applies. The kernel only
    stores into `o` and `lse` (never accumulates), so autotuning needs no reset_to_zero."""
    return tuning.fwd_config(Dk, Dv, item, kind, dtype=dtype, S_kv=S_kv, n=n, tune=tune)


def tma_unsupported(k, v) -> str | None:
    """Why K and V cannot be read through tensor descriptors, or None: they need SM >= 9.0
    (or the interpreter), at least one key, keys counted in int32, and positive strides (a
    descriptor takes neither an empty shape nor a broadcast, stride-0, dimension) with every
    row on a 16-byte boundary."""
    if k.shape[2] == 0:
        return "no keys: a tensor descriptor takes no empty dimension"
    if k.shape[2] > INT32_MAX:
        return f"S_kv={k.shape[2]} > 2^31 - 1: tensor descriptor coordinates are int32"
    if k.device.type == "cuda":
        cap = device_capability(k.device)
        if cap < TMA_MIN_CAPABILITY:
            return f"SM {cap[0]}.{cap[1]} < {TMA_MIN_CAPABILITY[0]}.{TMA_MIN_CAPABILITY[1]}"
    elif not interpreting():
        return f"k is on {k.device}; TMA needs a CUDA device or TRITON_INTERPRET=1"
    for name, x in (("k", k), ("v", v)):
        if x.data_ptr() % 16 or not all(st > 0 and st * x.element_size() % 16 == 0 for st in x.stride()[:3]):
            return f"{name} strides {x.stride()}: rows not positive 16-byte multiples on a 16-byte boundary"
    return None


def tma_supported(k, v) -> bool:
    return tma_unsupported(k, v) is None


def tma_descriptors(k, v, block_l: int):
    """Tensor descriptors of K and V [B, G, S_kv, D] with [1, 1, block_l, D padded] boxes
    (columns past D read as zeros)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return tuple(
        TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, block_l, pow2_at_least(x.shape[3], MIN_DOT)]) for x in (k, v)
    )


@functools.cache
def pair_kernel():
    """pairs.py, imported where a profile turns it on; None (this kernel serves) where this
    Triton has no Gluon."""
    try:
        from . import pairs
    except ImportError:
        return None
    return pairs


def _plan(q, k, v, norm_ranges, scale, positions, config, kind: str, key64: bool, clip: bool) -> tuple:
    """`(cfg, constexprs)` of a forward launch: the launch parameters (`launch_config`, or
    `config`) and every constexpr but TMA's final say, which reads the call's strides and
    alignment. Kept per (dtype, device, kind, Dk, Dv, h, n, L bucket, positions, key64) in
    the tuning state with the selection they came from, so a decode step pays one lookup,
    `tuning_status()` still names its selection, and `reload_settings` drops them."""
    B, S, G, h, Dk = q.shape
    S_kv, Dv, n = k.shape[2], v.shape[3], norm_ranges.shape[3]
    st = tuning.current_state()
    key = None
    if config is None:
        key = (q.dtype, q.device, kind, Dk, Dv, h, n, tuning.l_bucket(min(S_kv, n * st.range_len)), positions is None, key64)
        hit = st.plans.get(key)
        if hit is not None:
            st.last["fwd"] = hit[2]  # what tuning_status() reports, as fwd_config would set it
            return hit[:2]
    cfg = config or launch_config(
        Dk,
        Dv,
        q.element_size(),
        kind,
        dtype=q.dtype,
        S_kv=S_kv,
        n=n,
        tune=lambda default, space=None: tuning.tune_fwd(
            lambda kernel: triton_forward(q, k, v, norm_ranges, scale=scale, positions=positions, clip=clip, _tuner=kernel),
            kernel=_sel_fwd_kernel,
            default=default,
            space=space,
            do_bench=tuning.device_bench(q.device),
        )["config"],
    )
    meta = {
        "BLOCK_L": cfg["BLOCK_L"],
        "num_warps": cfg["num_warps"],
        "num_stages": cfg["num_stages"],
        "TMA": False,
        "TAIL_L": max(MIN_DOT, int(cfg.get("TAIL_L", cfg["BLOCK_L"]))),
    }
    meta.update(_constexprs(q, h, Dk, Dv, n, positions, key64))
    if key is not None and tuning.last_kept("fwd"):
        st.plans[key] = (cfg, meta, st.last["fwd"])
    return cfg, meta


def _constexprs(q, h: int, Dk: int, Dv: int, n: int, positions, key64: bool) -> dict:
    return {
        "HAS_POS": positions is not None,
        "IEEE": q.dtype == torch.float32,
        "H_PAD": pow2_at_least(h, MIN_DOT),
        "DK_PAD": pow2_at_least(Dk, MIN_DOT),
        "DV_PAD": pow2_at_least(Dv, MIN_DOT),
        "N_PAD": pow2_at_least(n, MIN_DOT),  # few compiled variants for n <= 16
        "KEY64": key64,
    }


def triton_forward(
    q,
    k,
    v,
    norm_ranges,
    *,
    scale: float,
    positions=None,
    out=None,
    config=None,
    clip=False,
    counter=None,
    kv_bytes_per_key=0,
    _tuner=None,
):
    """Raw launch of the forward kernel (no checks, no autograd).

    q [B,S,G,h,Dk], k [B,G,S_kv,Dk], v [B,G,S_kv,Dv] in fp32/fp16/bf16, any strides; ranges
    [B,S,G,n,2] sorted and disjoint (overlapping ranges would count keys twice), or, with
    `clip`, as a caller gives them (any order, overlapping, unclamped): the kernel then makes
    them disjoint itself, so a call needs no normalising launch. `counter` (int64 [2]) gets
    the call's selected tokens and `kv_bytes_per_key` times them added, as the normaliser adds them.
    Returns `(o, lse)`: `o` in v's dtype, `lse` fp32 [B,S,G,h], -inf for empty rows. `out`
    = `(o, lse)` writes into given tensors (tests poison them); `config` overrides
    `launch_config` (benchmarks sweep it); `_tuner` (tuning.py) launches through a
    `triton.autotune` wrapper of the kernel instead, which picks the launch parameters."""
    B, S, G, h, Dk = q.shape
    S_kv, Dv = k.shape[2], v.shape[3]
    n = norm_ranges.shape[3]
    if out is None:
        o = torch.empty(B, S, G, h, Dv, dtype=v.dtype, device=q.device)
        lse = torch.empty(B, S, G, h, dtype=torch.float32, device=q.device)
    else:
        o, lse = out
    rows = B * S * G
    if rows == 0:
        return o, lse
    q, k, v, norm_ranges = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v, norm_ranges))
    kind = tuning.kind_of(q.device, S)
    key64 = S_kv > INT32_MAX
    if _tuner is not None:
        meta = {"TMA": False, "TAIL_L": 0, **_constexprs(q, h, Dk, Dv, n, positions, key64)}  # the gather path
    else:
        cfg, meta = _plan(q, k, v, norm_ranges, scale, positions, config, kind, key64, clip)
        if kv_outer_routes(q, h, S_kv, cfg):
            from .kv_outer import kv_outer_forward

            norm_ranges = _normalised(norm_ranges, S_kv, positions, clip, counter, kv_bytes_per_key)
            record_launch("triton_fwd")
            record_launch("triton_fwd_kv_outer")
            return kv_outer_forward(q, k, v, norm_ranges, scale=scale, positions=positions, out=(o, lse))
        if cfg.get("PAIRS"):
            pairs = pair_kernel()
            if pairs is not None and pairs.unsupported(q, k, v, positions) is None:
                norm_ranges = _normalised(norm_ranges, S_kv, positions, clip, counter, kv_bytes_per_key)
                record_launch("triton_fwd")
                record_launch("triton_fwd_pairs")
                return pairs.pair_forward(q, k, v, norm_ranges, scale=scale, out=(o, lse))
        if cfg.get("TMA"):
            meta = {**meta, "TMA": not key64 and tma_supported(k, v)}  # TMA coordinates are int32
    record_launch("triton_fwd")
    descs = tma_descriptors(k, v, meta["BLOCK_L"]) if meta["TMA"] else (None, None)
    tensors = _tensor_args(q, k, v, descs, norm_ranges, positions, o, lse, counter)
    args = (*tensors, *_shape_args(q, k, v, norm_ranges, o, lse, scale, kv_bytes_per_key))
    launch(_tuner or _sel_fwd_kernel, (rows,), *args, CLIP=bool(clip), COUNT=counter is not None, **meta)
    return o, lse


def kv_outer_routes(q, h: int, S_kv: int, cfg: dict) -> bool:
    """Whether the KV-outer forward takes this call (`KV_OUTER_MAX_HEADS` >= h, and at least
    `KV_OUTER_MIN_TOKENS[h]` query tokens, B x S, where the profile sets one): prefill only; keys
    within the Triton normaliser's packed sort key (`normalize.MAX_S_KV`, 2^30: past it the row
    kernels serve, as they did before the route); not under CUDA graph capture (the index is
    sized on the host). The capture query comes last: a decode step never pays for it."""
    from .normalize import MAX_S_KV

    return (
        q.shape[1] > 1
        and h <= cfg.get("KV_OUTER_MAX_HEADS", 0)
        and q.shape[0] * q.shape[1] >= cfg.get("KV_OUTER_MIN_TOKENS", {}).get(h, 0)
        and S_kv <= MAX_S_KV
        and not (q.is_cuda and torch.cuda.is_current_stream_capturing())
    )


def _normalised(ranges, S_kv: int, positions, clip: bool, counter, kv_bytes_per_key: int):
    """`ranges` normalised, as the kernels other than fwd.py's take them: a call that asked
    fwd.py to clip (or to count) has them normalised by the Triton normaliser, which counts."""
    if not clip and counter is None:
        return ranges
    from .normalize import normalize_ranges_triton

    return normalize_ranges_triton(ranges, S_kv, positions, counter=counter, kv_bytes_per_key=kv_bytes_per_key)


def _tensor_args(q, k, v, descs, ranges, positions, o, lse, counter) -> tuple:
    """The forward kernel's leading arguments: its tensors and TMA descriptors (a pointer
    the kernel does not read stands in for an absent one)."""
    pos = positions.to(torch.int64).contiguous() if positions is not None else q
    return (q, k, v, *descs, ranges, pos, o, lse, counter if counter is not None else lse)


def _shape_args(q, k, v, ranges, o, lse, scale: float, kv_bytes_per_key: int) -> tuple:
    """The forward kernel's arguments after its tensors: what the call's shapes and strides
    alone decide."""
    S, G, h = q.shape[1:4]
    return (
        *q.stride()[:4],
        *k.stride()[:3],
        *v.stride()[:3],
        *ranges.stride()[:4],
        *o.stride()[:4],
        *lse.stride(),
        S,
        G,
        k.shape[2],
        h,
        q.shape[4],
        v.shape[3],
        ranges.shape[3],
        float(scale) * LOG2E,
        int(kv_bytes_per_key),
    )


def forward_replay(q, k, v, ranges, *, scale: float, positions=None, clip=False, counter=None, kv_bytes_per_key=0):
    """`triton_forward`'s launch for this call, kept for its repeats: a function of `(q, k, v,
    ranges, positions)` that allocates the outputs and launches, recomputing nothing, for inputs
    of this call's shapes, strides, dtypes, devices and 16-byte alignment (the dispatcher keys
    them: kernels/kept.py). It returns `(o, lse)`, or None once the tuning state its plan came
    from is gone (the caller then takes the full path). None (nothing to keep) for a call that
    copies an input, reads K/V through TMA descriptors, goes to the pair kernel, or is empty."""
    B, S, G, h, Dk = q.shape
    if B * S * G == 0 or any(x.stride(-1) != 1 for x in (q, k, v, ranges)):
        return None
    key64 = k.shape[2] > INT32_MAX
    cfg, meta = _plan(q, k, v, ranges, scale, positions, None, tuning.kind_of(q.device, S), key64, clip)
    if cfg.get("PAIRS") or cfg.get("TMA") or not tuning.last_kept("fwd"):  # a capture-time default is not kept
        return None
    state, selection = tuning.current_state(), tuning.last_choice("fwd")
    dev, o_shape, o_dtype, lse_shape = q.device, (B, S, G, h, v.shape[3]), v.dtype, (B, S, G, h)

    def outputs():
        return torch.empty(o_shape, dtype=o_dtype, device=dev), torch.empty(lse_shape, dtype=torch.float32, device=dev)

    o, lse = outputs()
    tensors = _tensor_args(q, k, v, (None, None), ranges, positions, o, lse, counter)
    tail = _shape_args(q, k, v, ranges, o, lse, scale, kv_bytes_per_key)
    go = bind(_sel_fwd_kernel, (B * S * G,), (*tensors, *tail), {"CLIP": bool(clip), "COUNT": counter is not None, **meta})

    def replay(q, k, v, ranges, positions):
        if not tuning.is_current(state):
            return None
        state.last["fwd"] = selection  # what tuning_status() reports, as a planned launch sets it
        o, lse = outputs()
        go(*_tensor_args(q, k, v, (None, None), ranges, positions, o, lse, counter), *tail)
        record_launch("triton_fwd")  # after: a launch that raises hands the call back to the ladder, which counts it
        return o, lse

    return replay
