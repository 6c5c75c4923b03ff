"""Gluon prefill forward for Hopper: two neighbouring query rows of one (b, g) per program.

Why: the Triton forward (fwd.py) is bound by moving the selected K/V tiles from L2 (91 % of
L2 throughput at the 64k prefill shape), and neighbouring rows select some tiles in common:
NSA's block 0 and the local blocks (the leading whole tiles of a row's first and last range).
A program here serves rows s and s + 1 with one warp each: a tile both select is loaded once
by TMA and broadcast to both warps' MMAs; every other whole tile is loaded by TMA per row into
one [2, BLOCK, D] stage that a batched mma_v2 reads, one warp per row; what is left (each
range's last < BLOCK keys, and whole tiles past the shorter row's) is gathered with masks.
That reads 7.8 % fewer bytes from L2 at that shape. Plain Triton cannot express the per-row
TMA stage (joining two descriptor loads goes through registers: 62-71 ms), hence Gluon, with
its explicit shared-memory views and layouts. Measured on the H100 (docs/design/triton-forward.md):
14.84-14.87 ms against 15.79-15.82 ms for fwd.py's TMA launch.

Same contract as fwd.py: online softmax in fp32, keys outside the ranges or past `t` never
read, empty rows write zeros and lse = -inf, fixed order (bitwise deterministic). Supported
inputs are narrower (`unsupported`); fwd.py serves the rest.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from selgate.device import device_capability
from selgate.kernels.triton_limits import PAIRS_CAPABILITY_MAJOR, PAIRS_DTYPES, PAIRS_HEAD_DIMS, PAIRS_MAX_HEADS

from .tiles import ceil_div, pow2_at_least

ROWS = 2  # rows a program (one warp each); 4 and 8 were slower (fewer programs fit an SM)
BLOCK = 32  # keys a tile
STAGES = 2  # tiles in flight a program; 3 stages (98 KB of shared memory) were slower
HEADS = PAIRS_MAX_HEADS  # heads padded to the MMA's 16 rows
HEAD_DIMS = PAIRS_HEAD_DIMS
LOG2E = 1.4426950408889634


@gluon.jit
def _add(a, b):
    """Combine function of the running sums (associative_scan)."""
    return a + b


@gluon.jit
def _issue(
    i,
    sf,
    Fmin,
    s0,
    sL,
    jk,
    rk,
    so,
    nfo,
    cumo,
    rowbase,
    k_desc,
    v_desc,
    ksm,
    vsm,
    bars,
    R: gl.constexpr,
    BL: gl.constexpr,
    D: gl.constexpr,
    STAGES: gl.constexpr,
    ITEM: gl.constexpr,
):
    """Start the TMA loads of step `i` into its stage: steps [0, sf) are the shared tiles of the
    first range, [sf, sf + Fmin) each row's own whole tiles (one slot a row), the rest the shared
    tiles of the last range. `so`, `nfo`, `cumo`: each row's own-tile starts, counts and their
    running sums, per range."""
    st = i % STAGES
    bar = bars.index(st)
    if (i < sf) | (i >= sf + Fmin):
        if i < sf:
            key = s0 + i * BL
        else:
            key = sL + (i - sf - Fmin) * BL
        mbarrier.expect(bar, 2 * BL * D * ITEM)
        tma.async_copy_global_to_shared(k_desc, [0, rowbase + key, 0], bar, ksm.index(st).slice(0, 1))
        tma.async_copy_global_to_shared(v_desc, [0, rowbase + key, 0], bar, vsm.index(st).slice(0, 1))
    else:
        ii = i - sf
        jj = gl.sum((cumo <= ii).to(gl.int32), 1)
        key0 = gl.sum(gl.where(jk[None, :] == jj[:, None], so + (ii - cumo + nfo) * BL, 0), 1)
        mbarrier.expect(bar, 2 * R * BL * D * ITEM)
        for r in gl.static_range(R):
            kr = gl.sum(gl.where(rk == r, key0, 0), 0)
            tma.async_copy_global_to_shared(k_desc, [0, rowbase + kr, 0], bar, ksm.index(st).slice(r, 1))
            tma.async_copy_global_to_shared(v_desc, [0, rowbase + kr, 0], bar, vsm.index(st).slice(r, 1))


@gluon.jit
def _softmax_pv(
    q_op,
    kt3,
    vt3,
    m_i,
    l_i,
    acc,
    qk_scale,
    MASKED: gl.constexpr,
    ok3,
    MMA: gl.constexpr,
    A_OP: gl.constexpr,
    R: gl.constexpr,
    H: gl.constexpr,
    BL: gl.constexpr,
):
    """One online-softmax step of all R rows: kt3 [R, D, BL], vt3 [R, BL, D] (`ok3` masks keys when MASKED)."""
    sc = mma_v2(q_op, kt3, gl.zeros([R, H, BL], gl.float32, MMA)) * qk_scale
    if MASKED:
        sc = gl.where(ok3, sc, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(sc, 2))
    if MASKED:
        m_new = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(sc - gl.expand_dims(m_new, 2))
    l_i = l_i * alpha + gl.sum(p, 2)
    p_op = gl.convert_layout(p.to(q_op.dtype), A_OP)
    acc = mma_v2(p_op, vt3, acc * gl.expand_dims(alpha, 2))
    return m_new, l_i, acc


@gluon.jit
def _pair_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    k_desc,
    v_desc,
    r_ptr,
    o_ptr,
    lse_ptr,
    sq_b,
    sq_s,
    sq_g,
    sq_h,
    sk_n,
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
    n,
    qk_scale,
    H: gl.constexpr,
    D: gl.constexpr,
    N_PAD: gl.constexpr,
    BL: gl.constexpr,
    STAGES: gl.constexpr,
    TAIL: gl.constexpr,
    SMEM: gl.constexpr,
    ITEM: gl.constexpr,
    R: gl.constexpr,
):
    """Rows c*R .. c*R + R - 1 of one (b, g). The key arithmetic is tiles.py's (block_key,
    gather_keys) written again with explicit layouts: Gluon cannot call triton.jit functions.
    Layouts: MMA puts row r on warp r; RNG holds [R, N_PAD] range tables (a row a warp); RK the
    same tables replicated in every warp, so the per-step key lookups reduce within a warp."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[R, 1, 1], instr_shape=[1, 16, 8])
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    B2: gl.constexpr = gl.SliceLayout(0, B_OP)
    RNG: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [R, 1], [1, 0])
    RK: gl.constexpr = gl.SliceLayout(0, gl.BlockedLayout([1, 1, 1], [1, R, 32 // R], [R, 1, 1], [2, 1, 0]))
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 2, 16], [R, 1, 1], [2, 1, 0])
    G3: gl.constexpr = gl.BlockedLayout([1, 1, 1], [1, 2, 16], [R, 1, 1], [2, 1, 0])

    pid = gl.program_id(0)
    nch = gl.cdiv(S, R)
    c = pid % nch
    bg = pid // nch
    b = (bg // G).to(gl.int64)  # int64: every stride product below may pass 2^31
    g = (bg % G).to(gl.int64)
    rowbase = bg * S_kv

    rr = gl.arange(0, R, layout=gl.SliceLayout(1, RNG))
    j = gl.arange(0, N_PAD, layout=gl.SliceLayout(0, RNG))
    s = c * R + rr
    row_ok = s < S
    t = s + S_kv - S
    lim = gl.minimum(gl.maximum(t + 1, 0), S_kv)
    rrow = r_ptr + b * sr_b + s[:, None].to(gl.int64) * sr_s + g * sr_g + j[None, :] * sr_j
    rm = row_ok[:, None] & (j[None, :] < n)
    start = gl.load(rrow, mask=rm, other=0).to(gl.int32)
    end = gl.load(rrow + 1, mask=rm, other=0).to(gl.int32)
    start = gl.minimum(gl.maximum(start, 0), lim[:, None])
    end = gl.minimum(gl.maximum(end, 0), lim[:, None])
    length = gl.maximum(end - start, 0)
    nfull = length // BL

    is0 = j[None, :] == 0
    start0 = gl.sum(gl.where(is0, start, 0), 1)
    nf0 = gl.sum(gl.where(is0, nfull, 0), 1)
    jl = gl.max(gl.where(length > 0, j[None, :], -1), 1)
    isl = j[None, :] == jl[:, None]
    startl = gl.sum(gl.where(isl, start, 0), 1)
    nfl = gl.sum(gl.where(isl, nfull, 0), 1)
    # Shared whole tiles: the leading ones of the first range and of the last non-empty
    # range, where every row of the program starts that range at the same key (and the
    # last range is not the first).
    sf = gl.min(nf0, 0) * (gl.max(start0, 0) == gl.min(start0, 0)).to(gl.int32)
    sl = gl.min(nfl, 0) * ((gl.max(startl, 0) == gl.min(startl, 0)) & (gl.min(jl, 0) >= 1)).to(gl.int32)
    s0 = gl.max(start0, 0)
    sL = gl.max(startl, 0)
    skip = gl.where(is0, sf, 0) + gl.where(isl, sl, 0)
    start_o = start + skip * BL
    len_o = length - skip * BL
    nf_o = len_o // BL
    Fmin = gl.min(gl.sum(nf_o, 1), 0)
    cum_o = gl.associative_scan(nf_o, 1, _add)
    so = gl.convert_layout(start_o, RK)
    nfo = gl.convert_layout(nf_o, RK)
    cumo = gl.convert_layout(cum_o, RK)
    jk = gl.arange(0, N_PAD, layout=gl.SliceLayout(0, RK))
    rk = gl.arange(0, R, layout=gl.SliceLayout(1, RK))
    taken = gl.minimum(gl.maximum(Fmin - (cum_o - nf_o), 0), nf_o)
    start_g = start_o + taken * BL
    len_g = len_o - taken * BL

    # q of the program's rows, once
    r3 = gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    h3 = gl.arange(0, H, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    d3 = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    s3 = c * R + r3
    qm = (s3 < S)[:, None, None] & (h3 < h)[None, :, None] & (d3 < D)[None, None, :]  # full-shape mask
    qoff = b * sq_b + s3[:, None, None].to(gl.int64) * sq_s + g * sq_g + h3[None, :, None].to(gl.int64) * sq_h + d3[None, None, :]
    q = gl.load(q_ptr + qoff, mask=qm, other=0.0)
    q_op = gl.convert_layout(q, A_OP)

    ksm = gl.allocate_shared_memory(q_ptr.dtype.element_ty, [STAGES, R, BL, D], SMEM)
    vsm = gl.allocate_shared_memory(q_ptr.dtype.element_ty, [STAGES, R, BL, D], SMEM)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s_ in gl.static_range(STAGES):
        mbarrier.init(bars.index(s_), count=1)
    fence_async_shared()

    m_i = gl.full([R, H], float("-inf"), gl.float32, gl.SliceLayout(2, MMA))
    l_i = gl.zeros([R, H], gl.float32, gl.SliceLayout(2, MMA))
    acc = gl.zeros([R, H, D], gl.float32, MMA)

    T = sf + Fmin + sl
    for p in gl.static_range(STAGES):
        if p < T:
            _issue(p, sf, Fmin, s0, sL, jk, rk, so, nfo, cumo, rowbase, k_desc, v_desc, ksm, vsm, bars, R, BL, D, STAGES, ITEM)
    for i in range(0, T):
        st = i % STAGES
        mbarrier.wait(bars.index(st), (i // STAGES) & 1)
        if (i < sf) | (i >= sf + Fmin):
            kt = gl.expand_dims(ksm.index(st).reshape([R * BL, D]).slice(0, BL).permute((1, 0)).load(B2), 0)
            vt = gl.expand_dims(vsm.index(st).reshape([R * BL, D]).slice(0, BL).load(B2), 0)
            kt3 = gl.broadcast(kt, gl.full([R, D, BL], 0, q_ptr.dtype.element_ty, B_OP))[0]
            vt3 = gl.broadcast(vt, gl.full([R, BL, D], 0, q_ptr.dtype.element_ty, B_OP))[0]
        else:
            kt3 = ksm.index(st).permute((0, 2, 1)).load(B_OP)
            vt3 = vsm.index(st).load(B_OP)
        m_i, l_i, acc = _softmax_pv(q_op, kt3, vt3, m_i, l_i, acc, qk_scale, False, 0, MMA, A_OP, R, H, BL)
        gl.thread_barrier()
        if i + STAGES < T:
            _issue(
                i + STAGES,
                sf,
                Fmin,
                s0,
                sL,
                jk,
                rk,
                so,
                nfo,
                cumo,
                rowbase,
                k_desc,
                v_desc,
                ksm,
                vsm,
                bars,
                R,
                BL,
                D,
                STAGES,
                ITEM,
            )

    # The rest of every row (tiles past the shortest row's, and each range's last < BL keys), gathered with masks.
    stop = gl.associative_scan(len_g, 1, _add)
    first = stop - len_g
    Lg = gl.sum(len_g, 1)
    LgM = gl.max(Lg, 0)
    stop3 = gl.convert_layout(stop, gl.SliceLayout(1, G3))
    first3 = gl.convert_layout(first, gl.SliceLayout(1, G3))
    startg3 = gl.convert_layout(start_g, gl.SliceLayout(1, G3))
    Lg3 = gl.convert_layout(Lg, gl.SliceLayout(1, gl.SliceLayout(2, G3)))
    lim3 = gl.convert_layout(lim, gl.SliceLayout(1, gl.SliceLayout(2, G3)))
    pp = gl.arange(0, TAIL, layout=gl.SliceLayout(0, gl.SliceLayout(2, G3)))
    KL: gl.constexpr = gl.BlockedLayout([1, 8, 1], [1, 16, 2], [R, 1, 1], [1, 2, 0])  # [R, D, TAIL], D fastest
    VL: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 2, 16], [R, 1, 1], [2, 1, 0])  # [R, TAIL, D]
    dk_ = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(2, KL)))
    dv_ = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(1, VL)))
    for p0 in range(0, LgM, TAIL):
        pos = p0 + pp
        inr = (pos[None, :, None] >= first3[:, None, :]) & (pos[None, :, None] < stop3[:, None, :])
        key = gl.sum(gl.where(inr, startg3[:, None, :] + pos[None, :, None] - first3[:, None, :], 0), 2)
        ok = (pos[None, :] < Lg3[:, None]) & (key < lim3[:, None])
        keyk = gl.convert_layout(key, gl.SliceLayout(1, KL))
        okk = gl.convert_layout(ok, gl.SliceLayout(1, KL))
        kt = gl.load(
            k_ptr + (rowbase + keyk[:, None, :]).to(gl.int64) * sk_n + dk_[None, :, None], mask=okk[:, None, :], other=0.0
        )
        keyv = gl.convert_layout(key, gl.SliceLayout(2, VL))
        okv = gl.convert_layout(ok, gl.SliceLayout(2, VL))
        vt = gl.load(
            v_ptr + (rowbase + keyv[:, :, None]).to(gl.int64) * sv_n + dv_[None, None, :], mask=okv[:, :, None], other=0.0
        )
        ok3 = gl.expand_dims(gl.convert_layout(ok, gl.SliceLayout(1, MMA)), 1)
        m_i, l_i, acc = _softmax_pv(
            q_op,
            gl.convert_layout(kt, B_OP),
            gl.convert_layout(vt, B_OP),
            m_i,
            l_i,
            acc,
            qk_scale,
            True,
            ok3,
            MMA,
            A_OP,
            R,
            H,
            TAIL,
        )

    nonempty = l_i != 0  # NaN (a NaN or infinite score) is not empty: lse and o stay NaN
    l_safe = gl.where(nonempty, l_i, 1.0)
    o = gl.convert_layout(acc / gl.expand_dims(l_safe, 2), L3)
    lse = gl.convert_layout(
        gl.where(nonempty, (m_i + gl.log2(l_safe)) * 0.6931471805599453, float("-inf")), gl.SliceLayout(2, L3)
    )
    ooff = b * so_b + s3[:, None, None].to(gl.int64) * so_s + g * so_g + h3[None, :, None].to(gl.int64) * so_h + d3[None, None, :]
    gl.store(o_ptr + ooff, o.to(o_ptr.dtype.element_ty), mask=qm)
    loff = b * sl_b + s3[:, None].to(gl.int64) * sl_s + g * sl_g + h3[None, :] * sl_h
    gl.store(lse_ptr + loff, lse, mask=(s3 < S)[:, None] & (h3 < h)[None, :])


def unsupported(q, k, v, positions) -> str | None:
    """Why this kernel cannot take the call (None when it can): an SM 9.x device (the one it
    was measured on) and `layout_problem`."""
    if not q.is_cuda or device_capability(q.device)[0] != PAIRS_CAPABILITY_MAJOR:
        return f"not an SM {PAIRS_CAPABILITY_MAJOR}.x device"
    return layout_problem(q, k, v, positions)


def layout_problem(q, k, v, positions) -> str | None:
    """A prefill call (S > 1: what it was written and measured for, and what the matrix declares
    of it), fp16/bf16, Dk == Dv in HEAD_DIMS, h <= 16, no explicit positions, and K and V each
    addressable as one [B*G*S_kv, D] row table (the (b, g) strides collapse onto the key
    stride) on 16-byte boundaries; None when all hold."""
    B, S, G, h, Dk = q.shape
    if S == 1:
        return "decode (S=1): the pair kernel serves prefill"
    if q.dtype not in PAIRS_DTYPES or not q.dtype == k.dtype == v.dtype:
        return f"dtypes q {q.dtype}, k {k.dtype}, v {v.dtype}"
    if h > HEADS or Dk not in HEAD_DIMS or v.shape[3] != Dk:
        return f"h={h}, Dk={Dk}, Dv={v.shape[3]}"
    if positions is not None:
        return "explicit positions"
    S_kv = k.shape[2]
    if B * G * S_kv >= 2**31:
        return f"B*G*S_kv={B * G * S_kv} >= 2^31"
    for name, x in (("k", k), ("v", v)):
        sb, sg, sn, sd = x.stride()
        if sd != 1 or (G > 1 and sg != S_kv * sn) or (B > 1 and sb != G * S_kv * sn):
            return f"{name} strides {x.stride()}: (b, g) do not collapse onto the key stride"
        if x.data_ptr() % 16 or sn * x.element_size() % 16:
            return f"{name} rows not on 16-byte boundaries"
        if sn <= 0:
            return f"{name} key stride {sn}: a tensor descriptor needs a positive stride"
    return None


def pair_forward(q, k, v, norm_ranges, *, scale: float, out):
    """Launch on normalised ranges into `out = (o, lse)`; the caller checked `unsupported`."""
    B, S, G, h, D = q.shape
    S_kv = k.shape[2]
    o, lse = out
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    smem = gl.NVMMASharedLayout.get_default_for([1, BLOCK, D], gdt)
    descs = [
        TensorDescriptor(x, [1, B * G * S_kv, D], [B * G * S_kv * x.stride(2), x.stride(2), 1], [1, BLOCK, D], smem)
        for x in (k, v)
    ]
    _pair_kernel[(B * G * ceil_div(S, ROWS),)](
        q,
        k,
        v,
        *descs,
        norm_ranges,
        o,
        lse,
        *q.stride()[:4],
        k.stride(2),
        v.stride(2),
        *norm_ranges.stride()[:4],
        *o.stride()[:4],
        *lse.stride(),
        S,
        G,
        S_kv,
        h,
        norm_ranges.shape[3],
        float(scale) * LOG2E,
        H=HEADS,
        D=D,
        N_PAD=pow2_at_least(norm_ranges.shape[3], 16),
        BL=BLOCK,
        STAGES=STAGES,
        TAIL=BLOCK,
        SMEM=smem,
        ITEM=q.element_size(),
        R=ROWS,
        num_warps=ROWS,
    )
    return o, lse
