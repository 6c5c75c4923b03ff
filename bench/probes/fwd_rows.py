"""Probe (thirteenth session, reverted in the next commit): R neighbouring rows of one (b, g) per program.

Tiles all R rows select (the leading whole tiles of their first and of their last range: NSA block 0 and
the local blocks) load once through the tensor descriptors and feed a batched dot by broadcast; every
other whole tile loads per row (cp.async, contiguous keys) into an [R, BLOCK_L, D] batch; the rest is
gathered with masks. Parity against the fp64 reference (NaN-poisoned unselected keys and outputs) on
small shapes, then do_bench at the issue-4 shape against the profile launch. Findings:
bench/results/h100/triton_fwd_dev.md, thirteenth session. Usage on a GPU: python3 bench/probes/fwd_rows.py"""
import itertools

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from selgate.bench.inputs import make_inputs, prefill_problem
from selgate.kernels.triton.fwd import triton_forward
from selgate.kernels.triton.tiles import block_key
from selgate.reference import build_ranges, normalize_ranges, selected_keys, selection_attention_ref

LOG2E = 1.4426950408889634


@triton.jit
def _step(sc, vt3, m_i, l_i, acc, qk_scale, MASKED: tl.constexpr):
    """sc [R, H, BL] raw scores (-inf where masked), vt3 [R, BL, DV] or None-equivalent handled by caller."""
    sc = sc * qk_scale
    m_new = tl.maximum(m_i, tl.max(sc, 2))
    if MASKED:
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_new)
    pr = tl.exp2(sc - m_new[:, :, None])
    l_i = l_i * alpha + tl.sum(pr, 2)
    return m_new, l_i, alpha, pr


@triton.jit
def _shared(q, k_desc, v_desc, bi, gi, key0, m_i, l_i, acc, qk_scale, R: tl.constexpr, H_PAD: tl.constexpr,
            DK_PAD: tl.constexpr, DV_PAD: tl.constexpr, BLOCK_L: tl.constexpr, BCAST: tl.constexpr):
    kt = tl.reshape(k_desc.load([bi, gi, key0, 0]), (BLOCK_L, DK_PAD))
    vt = tl.reshape(v_desc.load([bi, gi, key0, 0]), (BLOCK_L, DV_PAD))
    if BCAST:
        sc = tl.dot(q, tl.broadcast_to(tl.trans(kt)[None, :, :], (R, DK_PAD, BLOCK_L)))
        m_i, l_i, alpha, pr = _step(sc, 0, m_i, l_i, acc, qk_scale, False)
        pv = tl.dot(pr.to(vt.dtype), tl.broadcast_to(vt[None, :, :], (R, BLOCK_L, DV_PAD)))
    else:
        q2 = tl.reshape(q, (R * H_PAD, DK_PAD))
        sc = tl.reshape(tl.dot(q2, tl.trans(kt)), (R, H_PAD, BLOCK_L))
        m_i, l_i, alpha, pr = _step(sc, 0, m_i, l_i, acc, qk_scale, False)
        pv = tl.reshape(tl.dot(tl.reshape(pr.to(vt.dtype), (R * H_PAD, BLOCK_L)), vt), (R, H_PAD, DV_PAD))
    return m_i, l_i, acc * alpha[:, :, None] + pv


@triton.jit
def _rows_kernel(
    q_ptr, k_ptr, v_ptr, k_desc, v_desc, r_ptr, o_ptr, lse_ptr,
    sq_b, sq_s, sq_g, sq_h,
    sk_b, sk_g, sk_n,
    sv_b, sv_g, sv_n,
    sr_b, sr_s, sr_g, sr_j,
    so_b, so_s, so_g, so_h,
    sl_b, sl_s, sl_g, sl_h,
    S, G, S_kv, h, Dk, Dv, n, qk_scale,
    R: tl.constexpr, H_PAD: tl.constexpr, DK_PAD: tl.constexpr, DV_PAD: tl.constexpr, N_PAD: tl.constexpr,
    BLOCK_L: tl.constexpr, TAIL_L: tl.constexpr, SHARE: tl.constexpr, SCALAR_KEYS: tl.constexpr, BCAST: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    nch = tl.cdiv(S, R)
    c = pid % nch
    g = (pid // nch) % G
    b = pid // (nch * G)
    rr = tl.arange(0, R)
    s = c * R + rr
    row_ok = s < S
    t = s + S_kv - S
    lim = tl.minimum(tl.maximum(t + 1, 0), S_kv).to(tl.int32)

    j = tl.arange(0, N_PAD)
    r_row = r_ptr + b * sr_b + s[:, None] * sr_s + g * sr_g + j[None, :] * sr_j
    rm = row_ok[:, None] & (j[None, :] < n)
    start = tl.load(r_row, mask=rm, other=0).to(tl.int32)
    end = tl.load(r_row + 1, mask=rm, other=0).to(tl.int32)
    start = tl.minimum(tl.maximum(start, 0), lim[:, None])
    end = tl.minimum(tl.maximum(end, 0), lim[:, None])
    length = tl.maximum(end - start, 0)
    nfull = length // BLOCK_L

    # Whole tiles every row shares: the leading tiles of the first range, and of the last
    # non-empty range, where all R rows start that range at the same key.
    is0 = j[None, :] == 0
    start0 = tl.sum(tl.where(is0, start, 0), 1)
    nf0 = tl.sum(tl.where(is0, nfull, 0), 1)
    jl = tl.max(tl.where(length > 0, j[None, :], -1), 1)
    isl = j[None, :] == jl[:, None]
    startl = tl.sum(tl.where(isl, start, 0), 1)
    nfl = tl.sum(tl.where(isl, nfull, 0), 1)
    if SHARE:
        sf = tl.where(tl.max(start0, 0) == tl.min(start0, 0), tl.min(nf0, 0), 0)
        sl = tl.where((tl.max(startl, 0) == tl.min(startl, 0)) & (tl.min(jl, 0) >= 1), tl.min(nfl, 0), 0)
    else:
        sf = 0
        sl = 0
    s0 = tl.max(start0, 0)  # first key of the shared first-range tiles (all equal when sf > 0)
    sL = tl.max(startl, 0)
    skip = tl.where(is0, sf, 0) + tl.where(isl, sl, 0)
    start_o = start + skip * BLOCK_L
    len_o = length - skip * BLOCK_L
    nf_o = len_o // BLOCK_L
    cum = tl.cumsum(nf_o, 1)
    Fmin = tl.min(tl.sum(nf_o, 1), 0)
    taken = tl.minimum(tl.maximum(Fmin - (cum - nf_o), 0), nf_o)
    start_g = start_o + taken * BLOCK_L
    len_g = len_o - taken * BLOCK_L

    hh = tl.arange(0, H_PAD)
    dk = tl.arange(0, DK_PAD)
    dv = tl.arange(0, DV_PAD)
    kk = tl.arange(0, BLOCK_L)
    q_rows = q_ptr + b * sq_b + s[:, None, None] * sq_s + g * sq_g + hh[None, :, None].to(tl.int64) * sq_h
    q = tl.load(q_rows + dk[None, None, :], mask=row_ok[:, None, None] & (hh[None, :, None] < h)
                & (dk[None, None, :] < Dk), other=0.0)
    k_grp = k_ptr + b * sk_b + g * sk_g
    v_grp = v_ptr + b * sv_b + g * sv_g
    bi = b.to(tl.int32)
    gi = g.to(tl.int32)

    m_i = tl.full([R, H_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([R, H_PAD], tl.float32)
    acc = tl.zeros([R, H_PAD, DV_PAD], tl.float32)

    # shared tiles of the first range
    for i in tl.range(0, sf):
        m_i, l_i, acc = _shared(q, k_desc, v_desc, bi, gi, s0 + i * BLOCK_L, m_i, l_i, acc, qk_scale, R, H_PAD,
                                DK_PAD, DV_PAD, BLOCK_L, BCAST)
    # each row's own whole tiles, in lock step while every row has one
    if SCALAR_KEYS:
        ownst_a = tl.sum(tl.where(rr[:, None] == 0, start_o, 0), 0)
        ownst_b = tl.sum(tl.where(rr[:, None] == 1, start_o, 0), 0)
        nf_a = tl.sum(tl.where(rr[:, None] == 0, nf_o, 0), 0)
        nf_b = tl.sum(tl.where(rr[:, None] == 1, nf_o, 0), 0)
        cum_a = tl.cumsum(nf_a, 0)
        cum_b = tl.cumsum(nf_b, 0)
    for i in tl.range(0, Fmin):
        if SCALAR_KEYS:  # R == 2: each row's key as a scalar, no layout conversion in the loop
            key0 = tl.where(rr == 0, block_key(i, j, ownst_a, nf_a, cum_a, BLOCK_L),
                            block_key(i, j, ownst_b, nf_b, cum_b, BLOCK_L))
        else:
            jj = tl.sum((cum <= i).to(tl.int32), 1)
            key0 = tl.sum(tl.where(j[None, :] == jj[:, None], start_o + (i - cum + nf_o) * BLOCK_L, 0), 1)
        key = (key0[:, None] + kk[None, :]).to(tl.int64)
        kt3 = tl.load(k_grp + key[:, None, :] * sk_n + dk[None, :, None])
        vt3 = tl.load(v_grp + key[:, :, None] * sv_n + dv[None, None, :])
        sc = tl.dot(q, kt3)
        m_i, l_i, alpha, pr = _step(sc, 0, m_i, l_i, acc, qk_scale, False)
        acc = acc * alpha[:, :, None] + tl.dot(pr.to(vt3.dtype), vt3)
    # shared tiles of the last range
    for i in tl.range(0, sl):
        m_i, l_i, acc = _shared(q, k_desc, v_desc, bi, gi, sL + i * BLOCK_L, m_i, l_i, acc, qk_scale, R, H_PAD,
                                DK_PAD, DV_PAD, BLOCK_L, BCAST)
    # the rest of every row, gathered with masks
    stop = tl.cumsum(len_g, 1)
    first = stop - len_g
    Lg = tl.sum(len_g, 1)
    pp = tl.arange(0, TAIL_L)
    for p0 in tl.range(0, tl.max(Lg, 0), TAIL_L):
        p = p0 + pp
        inr = (p[None, :, None] >= first[:, None, :]) & (p[None, :, None] < stop[:, None, :])
        key = tl.sum(tl.where(inr, start_g[:, None, :] + p[None, :, None] - first[:, None, :], 0), 2).to(tl.int64)
        ok = (p[None, :] < Lg[:, None]) & (key < lim[:, None])
        kt3 = tl.load(k_grp + key[:, None, :] * sk_n + dk[None, :, None], mask=ok[:, None, :] & (dk[None, :, None] < Dk),
                      other=0.0)
        vt3 = tl.load(v_grp + key[:, :, None] * sv_n + dv[None, None, :], mask=ok[:, :, None] & (dv[None, None, :] < Dv),
                      other=0.0)
        sc = tl.where(ok[:, None, :], tl.dot(q, kt3), float("-inf"))
        m_i, l_i, alpha, pr = _step(sc, 0, m_i, l_i, acc, qk_scale, True)
        acc = acc * alpha[:, :, None] + tl.dot(pr.to(vt3.dtype), vt3)

    nonempty = l_i > 0
    l_safe = tl.where(nonempty, l_i, 1.0)
    o = acc / l_safe[:, :, None]
    lse = tl.where(nonempty, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    om = row_ok[:, None] & (hh[None, :] < h)
    o_rows = o_ptr + b * so_b + s[:, None, None] * so_s + g * so_g + hh[None, :, None].to(tl.int64) * so_h
    tl.store(o_rows + dv[None, None, :], o.to(o_ptr.dtype.element_ty), mask=om[:, :, None] & (dv[None, None, :] < Dv))
    tl.store(lse_ptr + b * sl_b + s[:, None] * sl_s + g * sl_g + hh[None, :] * sl_h, lse, mask=om)


def rows_forward(q, k, v, ranges, *, scale, R=2, num_warps=None, num_stages=3, BLOCK_L=32, TAIL_L=32, share=True,
                 bcast=True, scalar_keys=False, out=None):
    from selgate.kernels.triton.fwd import tma_descriptors
    B, S, G, h, Dk = q.shape
    S_kv, Dv = k.shape[2], v.shape[3]
    n = ranges.shape[3]
    o, lse = out if out is not None else (torch.empty(B, S, G, h, Dv, dtype=v.dtype, device=q.device),
                                          torch.empty(B, S, G, h, dtype=torch.float32, device=q.device))
    kd, vd = tma_descriptors(k, v, BLOCK_L)
    grid = (B * G * triton.cdiv(S, R),)
    _rows_kernel[grid](
        q, k, v, kd, vd, ranges, o, lse,
        *q.stride()[:4], *k.stride()[:3], *v.stride()[:3], *ranges.stride()[:4], *o.stride()[:4], *lse.stride(),
        S, G, S_kv, h, Dk, Dv, n, float(scale) * LOG2E,
        R=R, H_PAD=max(16, triton.next_power_of_2(h)), DK_PAD=max(16, triton.next_power_of_2(Dk)),
        DV_PAD=max(16, triton.next_power_of_2(Dv)), N_PAD=max(16, triton.next_power_of_2(n)),
        BLOCK_L=BLOCK_L, TAIL_L=TAIL_L, SHARE=share, SCALAR_KEYS=scalar_keys, BCAST=bcast,
        num_warps=num_warps or R, num_stages=num_stages)
    return o, lse

VARIANTS = [  # R, warps, stages, BL, bcast, share, scalar keys
    (2, 2, 3, 16, 1, 1, 1), (2, 2, 3, 32, 1, 1, 1), (2, 2, 2, 32, 1, 1, 1), (2, 2, 4, 16, 1, 1, 1),
    (2, 2, 2, 16, 1, 1, 1), (2, 2, 3, 16, 1, 0, 1), (2, 2, 3, 16, 1, 1, 0),
]
def call(x, v, out=None):
    R, w, st, bl, bc, sh, ot = v
    return rows_forward(x.q, x.k, x.v, x.ranges, scale=x.scale, R=R, num_warps=w, num_stages=st, BLOCK_L=bl,
                        TAIL_L=bl, share=bool(sh), bcast=bool(bc), scalar_keys=bool(ot), out=out)
torch.manual_seed(0)
bad = 0
for (S, S_kv, G, h, D, l_sel, n, dt, rnd) in [(700, 700, 2, 16, 128, 64, 16, torch.bfloat16, False),
                                             (333, 333, 1, 2, 128, 32, 6, torch.bfloat16, True)]:
    q = torch.randn(1, S, G, h, D, device=dev, dtype=dt); k = torch.randn(1, G, S_kv, D, device=dev, dtype=dt)
    v = torch.randn(1, G, S_kv, D, device=dev, dtype=dt)
    if rnd:
        st = torch.randint(0, S_kv, (1, S, G, n), device=dev); ln = torch.randint(0, 100, (1, S, G, n), device=dev)
        r = torch.stack([st, st + ln], -1)
    else:
        r = build_ranges(torch.rand(1, S, G, -(-S_kv // l_sel), device=dev), G=G, l_sel=l_sel, n=n, S_kv=S_kv)
    nr = normalize_ranges(r, S_kv).to(torch.int32)
    used = selected_keys(nr, S_kv)
    kp, vp = k.clone(), v.clone(); kp[~used] = float("nan"); vp[~used] = float("nan")
    ro, rl = selection_attention_ref(q.double(), k.double(), v.double(), r, return_lse=True)
    po, pl = triton_forward(q, kp, vp, nr, scale=D ** -0.5)
    base_err = (po.double() - ro).abs().max().item()
    class X: pass
    x = X(); x.q, x.k, x.v, x.ranges, x.scale = q, kp, vp, nr, D ** -0.5
    for vv in VARIANTS:
        o = torch.full_like(po, float("nan")); l = torch.full_like(pl, float("nan"))
        call(x, vv, out=(o, l))
        e = (o.double() - ro).abs().max().item(); mean = (o.double() - ro).abs().mean().item()
        le = (l.double() - rl).nan_to_num(posinf=0, neginf=0).abs().max().item()
        infok = bool(((l == float("-inf")) == (rl == float("-inf"))).all()) and not torch.isnan(l).any()
        ok = e <= max(2.5 * base_err, 1e-2) and infok and le < 1e-3 and mean < 1e-3
        bad += not ok
        print("parity", S, S_kv, h, D, dt, "rand" if rnd else "nsa", vv, "err", f"{e:.2e}", "base", f"{base_err:.2e}",
              "mean", f"{mean:.1e}", "lse", f"{le:.1e}", "OK" if ok else "FAIL", flush=True)
print("parity failures", bad, flush=True)

p = prefill_problem(65536, 64, 4, 128, 128, 64, 16, "bfloat16")
sets = [make_inputs(p, seed=s, device=dev) for s in range(2)]
ref = triton_forward(sets[0].q, sets[0].k, sets[0].v, sets[0].ranges, scale=sets[0].scale)[0].float()
it = itertools.count()
res = {}
cands = [("profile", None)] + [(str(v), v) for v in VARIANTS]
for name, v in cands:
    try:
        f = (lambda x: triton_forward(x.q, x.k, x.v, x.ranges, scale=x.scale)) if v is None else (lambda x, v=v: call(x, v))
        d = (f(sets[0])[0].float() - ref).abs().max().item()
        res[name] = [d]
    except Exception as e:
        print(name, "ERR", type(e).__name__, str(e)[:200], flush=True); continue
for rnd in range(2):
    for name, v in cands:
        if name not in res: continue
        f = (lambda x: triton_forward(x.q, x.k, x.v, x.ranges, scale=x.scale)) if v is None else (lambda x, v=v: call(x, v))
        t = do_bench(lambda: f(sets[next(it) % 2]), warmup=10, rep=300, return_mode="median")
        res[name].append(t)
        print(rnd, name, round(t, 3), flush=True)
print("| variant (R, warps, stages, BL, bcast, share, scalar keys) | round 0 ms | round 1 ms | max diff vs profile |")
for name, r in res.items():
    print(f"| {name} | {r[1]:.2f} | {r[2]:.2f} | {r[0]:.4g} |" if len(r) == 3 else f"| {name} | {r} |")
