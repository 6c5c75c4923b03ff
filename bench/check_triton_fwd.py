"""One-shot GPU check of the Triton forward: parity with the fp64 reference over the
forward parity matrix, then the two benchmark settings side by side with gather-then-SDPA,
packed SDPA and the copy bandwidth measured in the same run.

    python -m selgate.bench.check_triton_fwd --out DIR

Writes `DIR/parity.md`, `DIR/bench.md` and `DIR/results.json`; prints both tables last.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import subprocess
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from selgate.kernels import settings
from selgate.kernels.sdpa import selection_attention_sdpa
from selgate.reference import build_ranges, normalize_ranges, resolve_scale, selected_lengths
from selgate.reference.golden import gather_attention
from selgate.reference.ranges import expand_ranges

from selgate.kernels.triton.fwd import launch_config, triton_forward

from .timing import measure_limits, time_calls

DEV = "cuda"
PATTERNS = ("few", "many", "mixed", "heavy_reuse")
# Problem sizes of the device run.
SIZES = {
    "parity_S_kv": 2112,
    "decode": (128, 8, 8, 128, 16384),
    "prefill_T": 65536,
    "int64_S_kv": (1 << 24) + 64,
    "determinism": (2, 16, 4096, 20),
}
SWEEP = [
    (32, 4, 3),
    (64, 4, 2),
    (64, 4, 3),
    (64, 4, 4),
    (64, 8, 3),
    (128, 4, 2),
    (128, 8, 2),
    (128, 8, 3),
    (32, 4, 2),
    (32, 2, 2),
    (64, 2, 2),
    (64, 4, 1),
    (128, 4, 1),
]


def _cmd(*argv) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def stamp() -> dict:
    """GPU, driver, library versions and commit (SELGATE_COMMIT when the tree has no .git)."""
    commit = settings.get("SELGATE_COMMIT") or _cmd("git", "rev-parse", "--short", "HEAD") or "unknown"
    return {
        "gpu": torch.cuda.get_device_name(),
        "driver": _cmd("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def pattern_ranges(pattern: str, B: int, S: int, G: int, S_kv: int, g: torch.Generator) -> torch.Tensor:
    """Raw ranges [B,S,G,n,2] of one family; row (0, 0, 0) is always empty (L == 0)."""
    if pattern == "few":  # one or two 64-blocks
        blk = torch.randint(0, S_kv // 64, (B, S, G, 2, 1), generator=g) * 64
        r = torch.cat([blk, blk + 64], -1)
        r[..., 1, :] *= torch.randint(0, 2, (B, S, G, 1), generator=g)
    elif pattern == "many":  # 32 blocks of 64: L up to 2048
        blk = torch.rand(B, S, G, S_kv // 64, generator=g).argsort(-1)[..., :32, None] * 64
        r = torch.cat([blk, blk + 64], -1)
    elif pattern == "mixed":  # 16 ranges of random lengths, overlapping and out of bounds
        start = torch.randint(-8, S_kv, (B, S, G, 16, 1), generator=g)
        r = torch.cat([start, start + torch.randint(1, 200, (B, S, G, 16, 1), generator=g)], -1)
    else:  # heavy reuse: every row of a group reads the same few keys, duplicated
        base = torch.tensor([[0, 64], [0, 64], [S_kv - 128, S_kv], [S_kv // 2, S_kv // 2 + 17]])
        r = base.expand(B, S, G, 4, 2).clone()
    r[0, 0, 0] = 0
    return r.to(DEV)


def spec_check(dtype, o, lse, ref_o, ref_lse, low_o, low_lse) -> dict:
    """SPEC.md acceptance for o and lse; returns errors, bounds and the verdict."""
    empty = ~torch.isfinite(ref_lse)
    ok = bool(torch.isfinite(o).all()) and bool((lse[empty] == float("-inf")).all()) and bool((o[empty] == 0).all())
    ok &= bool(torch.isfinite(lse[~empty]).all())
    res = {}
    for name, x, ref, low in (("o", o, ref_o, low_o), ("lse", lse[~empty], ref_lse[~empty], low_lse[~empty])):
        if not ref.numel():
            continue
        err = (x.double() - ref).abs()
        if dtype == torch.float32:
            bound, mean_bound = 1e-5, 1e-6
        else:
            bound = 2 * float((low.double() - ref).abs().max()) + 2 * torch.finfo(dtype).eps * float(ref.abs().max())
            mean_bound = 1e-3
        res[name] = (float(err.max()), bound, float(err.mean()))
        ok &= float(err.max()) <= bound and float(err.mean()) <= mean_bound
    res["ok"] = ok
    return res


def parity(out: dict, budget_s: float) -> list:
    """The forward parity matrix: dtype x h x (Dk, Dv) x pattern x decode/prefill, strict kernel.
    Stops (and says so) when `budget_s` is spent, so the benchmark still runs."""
    g = torch.Generator().manual_seed(0)
    gd = torch.Generator(device=DEV).manual_seed(0)
    rows = []
    S_kv = SIZES["parity_S_kv"]
    t_end = time.time() + budget_s
    for dtype, (Dk, Dv) in itertools.product(
        (torch.float32, torch.float16, torch.bfloat16), itertools.product((64, 128, 192), repeat=2)
    ):
        if time.time() > t_end:
            rows.append((str(dtype).split(".")[1], Dk, Dv, None))
            continue
        worst = {"n": 0, "fail": 0, "o": (0, 1, 0), "lse": (0, 1, 0), "L": set()}
        k_all = torch.randn(3, 2, S_kv, Dk, device=DEV, generator=gd).to(dtype)
        v_all = torch.randn(3, 2, S_kv, Dv, device=DEV, generator=gd).to(dtype)
        for h, pattern, S in itertools.product((1, 2, 4, 8, 16), PATTERNS, (1, 48)):
            if time.time() > t_end:
                break
            B, G = (3, 2) if S == 1 else (1, 2)
            q = torch.randn(B, S, G, h, Dk, device=DEV, generator=gd).to(dtype)
            k, v = k_all[:B], v_all[:B]
            norm = normalize_ranges(pattern_ranges(pattern, B, S, G, S_kv, g), S_kv)
            L = selected_lengths(norm)
            sc = resolve_scale(None, Dk)
            o = torch.full((B, S, G, h, Dv), float("nan"), dtype=dtype, device=DEV)
            lse = torch.full((B, S, G, h), float("nan"), device=DEV)
            triton_forward(q, k, v, norm, scale=sc, out=(o, lse))
            ref_o, ref_lse = gather_attention(q, k, v, norm, scale=sc)
            low_o, low_lse = gather_attention(q, k, v, norm, scale=sc, dtype=dtype)
            r = spec_check(dtype, o, lse, ref_o, ref_lse, low_o, low_lse)
            worst["n"] += 1
            worst["fail"] += not r["ok"]
            worst["L"].update((int(L.min()), int(L.max())))
            for name in ("o", "lse"):
                if name in r and r[name][0] / r[name][1] > worst[name][0] / max(worst[name][1], 1e-30):
                    worst[name] = r[name]
            if not r["ok"]:
                print(f"PARITY FAIL {dtype} h={h} Dk={Dk} Dv={Dv} {pattern} S={S}: {r}", flush=True)
        rows.append((str(dtype).split(".")[1], Dk, Dv, worst))
        print(f"parity {rows[-1][0]} Dk={Dk} Dv={Dv}: {worst['n'] - worst['fail']}/{worst['n']} ok", flush=True)
    out["parity"] = [(d, dk, dv, w and {**w, "L": [min(w["L"]), max(w["L"])]}) for d, dk, dv, w in rows]
    return rows


def determinism_and_int64(out: dict) -> list:
    """Bitwise-repeatable output, and 64-bit offsets: K/V of 2^24 + 64 keys x 128 (> 2^31 elements)."""
    lines = []
    g = torch.Generator().manual_seed(1)
    B, S, S_kv, reps = SIZES["determinism"]
    dt = torch.bfloat16
    q = torch.randn(B, S, 2, 16, 128, generator=g).to(DEV, dt)
    k = torch.randn(B, 2, S_kv, 128, generator=g).to(DEV, dt)
    v = torch.randn(B, 2, S_kv, 128, generator=g).to(DEV, dt)
    norm = normalize_ranges(pattern_ranges("mixed", B, S, 2, S_kv, g), S_kv)
    first = triton_forward(q, k, v, norm, scale=0.1)
    same = all(all(torch.equal(a, b) for a, b in zip(first, triton_forward(q, k, v, norm, scale=0.1))) for _ in range(reps))
    lines.append(f"determinism ({reps} repeats, {dt} prefill, mixed ranges): {'bitwise identical' if same else 'DIFFERENT'}")
    S_kv = SIZES["int64_S_kv"]
    k = torch.randn(1, 1, S_kv, 128, device=DEV, dtype=dt)
    v = torch.randn(1, 1, S_kv, 128, device=DEV, dtype=dt)
    q = torch.randn(1, 1, 1, 8, 128, device=DEV, dtype=dt)
    norm = torch.tensor([[0, 64], [S_kv - 300, S_kv - 100], [S_kv - 64, S_kv]], device=DEV).view(1, 1, 1, 3, 2)
    o, lse = triton_forward(q, k, v, norm, scale=resolve_scale(None, 128))
    ref_o, ref_lse = gather_attention(q, k, v, norm, scale=resolve_scale(None, 128))
    low_o, low_lse = gather_attention(q, k, v, norm, scale=resolve_scale(None, 128), dtype=dt)
    r = spec_check(dt, o, lse, ref_o, ref_lse, low_o, low_lse)
    lines.append(
        f"64-bit offsets ({dt}, S_kv = {S_kv}, D=128: {S_kv * 128:,} elements per K): "
        f"{'ok' if r['ok'] else 'FAIL'} o max err {r['o'][0]:.3g} (bound {r['o'][1]:.3g})"
    )
    del k, v
    out["extra"] = lines
    for ln in lines:
        print(ln, flush=True)
    return lines


def gather_sdpa(q, k, v, norm, L: int, chunk_rows: int):
    """Baseline: gather each row's L selected keys, then one masked SDPA per row chunk."""
    B, S, G, h, Dk = q.shape
    qf = q.reshape(B * S * G, 1, h, Dk)
    rf = norm.reshape(B * S * G, -1, 2)
    kf, vf = k.reshape(B * G, -1, Dk), v.reshape(B * G, -1, v.shape[-1])
    row = torch.arange(B * S * G, device=q.device)
    bg = row // (S * G) * G + row % G
    outs = []
    for i in range(0, B * S * G, chunk_rows):
        idx, valid = expand_ranges(rf[i : i + chunk_rows], L)
        bgi = bg[i : i + chunk_rows, None]
        outs.append(
            F.scaled_dot_product_attention(
                qf[i : i + chunk_rows], kf[bgi, idx][:, None], vf[bgi, idx][:, None], attn_mask=valid[:, None, None, :]
            )
        )
    return torch.cat(outs)


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write), timed like the kernels."""
    return measure_limits(torch.device(DEV), torch.bfloat16).copy_gbps * 1e9


def time_ms(fn, iters=100) -> float:
    """Median ms per call (bench.timing: event-timed batches of back-to-back calls)."""
    return time_calls([fn], torch.device(DEV), warmup=3, iters=iters).median_ms


def sweep(q, k, v, norm, sc, ref_rows, kind: str) -> list:
    """Time each launch config; each one's output rows must match the reference check."""
    res = []
    for bl, nw, ns in SWEEP:
        cfg = {"BLOCK_L": bl, "num_warps": nw, "num_stages": ns}
        try:
            o, _ = triton_forward(q, k, v, norm, scale=sc, config=cfg)
            ok = ref_rows(o)
            ms = time_ms(lambda: triton_forward(q, k, v, norm, scale=sc, config=cfg))
        except Exception as e:  # e.g. out of shared memory: record and go on
            res.append((cfg, None, f"{type(e).__name__}"))
            continue
        res.append((cfg, ms, "ok" if ok else "WRONG"))
        print(f"  {kind} BLOCK_L={bl} warps={nw} stages={ns}: {ms:.4f} ms {res[-1][2]}", flush=True)
    return res


def bench(out: dict) -> list:
    """Decode (N=1024 rows, h=8, D=128, L in {512, 1024}) and prefill (T=65536, G=4, h=16,
    16 blocks of 64), bf16, against gather-then-SDPA, packed SDPA and the HBM floor."""
    lines = []
    bw = copy_bandwidth()
    lines.append(f"copy bandwidth (1 GiB device-to-device, read+write): {bw / 1e12:.3f} TB/s")
    print(lines[-1], flush=True)
    dt = torch.bfloat16
    g = torch.Generator(device=DEV).manual_seed(2)
    B, G, h, D, S_kv = SIZES["decode"]  # 1024 decode rows; K/V 8.6 GB >> L2
    k = torch.randn(B, G, S_kv, D, device=DEV, dtype=dt, generator=g)
    v = torch.randn(B, G, S_kv, D, device=DEV, dtype=dt, generator=g)
    q = torch.randn(B, 1, G, h, D, device=DEV, dtype=dt, generator=g)
    sc = resolve_scale(None, D)
    rows = []
    for L in (512, 1024):
        p = torch.rand(B, 1, G, S_kv // 64, device=DEV, generator=g)
        norm = build_ranges(p, G=G, l_sel=64, n=L // 64, S_kv=S_kv)
        tokens = int(selected_lengths(norm).sum())
        floor_bytes = tokens * 2 * D * 2 + 2 * q.numel() * 2 + B * G * h * 4
        floor_ms = floor_bytes / bw * 1e3
        sub = slice(0, 8)
        ref_o, _ = gather_attention(q[sub], k[sub], v[sub], norm[sub], scale=sc)
        low_o, _ = gather_attention(q[sub], k[sub], v[sub], norm[sub], scale=sc, dtype=dt)
        bound = 2 * float((low_o.double() - ref_o).abs().max()) + 2 * torch.finfo(dt).eps * float(ref_o.abs().max())

        def ref_rows(o):
            return float((o[sub].double() - ref_o).abs().max()) <= bound

        cfgs = sweep(q, k, v, norm, sc, ref_rows, f"decode L={L}")
        default = launch_config(D, D, 2, "decode", dtype=dt, S_kv=S_kv, n=norm.shape[3])  # what triton_forward chooses
        t_def = time_ms(lambda: triton_forward(q, k, v, norm, scale=sc))
        t_gs = time_ms(lambda: gather_sdpa(q, k, v, norm, L, B * G), iters=10)
        t_pk = time_ms(lambda: selection_attention_sdpa(q, k, v, norm, scale=sc, normalized=True), iters=10)
        best = min((c for c in cfgs if c[1] is not None and c[2] == "ok"), key=lambda c: c[1], default=None)
        rows.append((f"decode L={L}", t_def, default, best, floor_ms, t_gs, t_pk))
    del k, v, q
    T, G, h = SIZES["prefill_T"], 4, 16
    k = torch.randn(1, G, T, D, device=DEV, dtype=dt, generator=g)
    v = torch.randn(1, G, T, D, device=DEV, dtype=dt, generator=g)
    q = torch.randn(1, T, G, h, D, device=DEV, dtype=dt, generator=g)
    p = torch.rand(1, T, G, T // 64, device=DEV, generator=g)
    norm = build_ranges(p, G=G, l_sel=64, n=16, S_kv=T)
    del p
    tail = slice(T - 256, T)  # the last 256 queries: full 16-block rows
    ref_o, _ = gather_attention(q[:, tail], k, v, norm[:, tail], scale=sc)
    low_o, _ = gather_attention(q[:, tail], k, v, norm[:, tail], scale=sc, dtype=dt)
    bound = 2 * float((low_o.double() - ref_o).abs().max()) + 2 * torch.finfo(dt).eps * float(ref_o.abs().max())

    def ref_rows_p(o):
        return float((o[:, tail].double() - ref_o).abs().max()) <= bound

    cfgs = sweep(q, k, v, norm, sc, ref_rows_p, "prefill")
    default = launch_config(D, D, 2, "prefill", dtype=dt, S_kv=T, n=norm.shape[3])
    t_def = time_ms(lambda: triton_forward(q, k, v, norm, scale=sc), iters=30)
    t_gs = time_ms(lambda: gather_sdpa(q, k, v, norm, 1024, 16384), iters=3)
    t_pk = time_ms(lambda: selection_attention_sdpa(q, k, v, norm, scale=sc, normalized=True), iters=3)
    best = min((c for c in cfgs if c[1] is not None and c[2] == "ok"), key=lambda c: c[1], default=None)
    rows.append(("prefill T=65536", t_def, default, best, None, t_gs, t_pk))
    out["bench"] = [(r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows]
    out["copy_bw_TBps"] = bw / 1e12
    out["sweeps_last"] = cfgs
    return lines + [""] + bench_table(rows)


def bench_table(rows) -> list:
    def cfg_s(c):
        paths = "".join(f" {name}" for name in ("TMA", "PAIRS") if c.get(name))
        return f"{c['BLOCK_L']}/{c['num_warps']}/{c['num_stages']}{paths}"

    t = [
        "| setting | triton (default cfg) ms | default BLOCK_L/warps/stages (path) | best swept cfg, ms | HBM floor ms | "
        "triton / floor | gather-then-SDPA ms | packed SDPA ms | speed-up vs gather-SDPA |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, t_def, default, best, floor, t_gs, t_pk in rows:
        ratio = f"{t_def / floor:.2f}x" if floor else "-"
        best_s = f"{cfg_s(best[0])}: {best[1]:.4f}" if best else "none valid"
        t.append(
            f"| {name} | {t_def:.4f} | {cfg_s(default)} | {best_s} | "
            f"{f'{floor:.4f}' if floor else '-'} | {ratio} | {t_gs:.3f} | {t_pk:.3f} | {t_gs / t_def:.1f}x |"
        )
    return t


def parity_table(rows) -> list:
    t = [
        "| dtype | Dk | Dv | cases ok | L range | worst o: max err / bound (mean) | worst lse: max err / bound (mean) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d, dk, dv, w in rows:
        if w is None or not w["n"]:
            t.append(f"| {d} | {dk} | {dv} | not run: time budget spent | | | |")
            continue

        def e(x):
            return f"{x[0]:.2e} / {x[1]:.2e} ({x[2]:.1e})"

        t.append(
            f"| {d} | {dk} | {dv} | {w['n'] - w['fail']}/{w['n']} | {min(w['L'])}..{max(w['L'])} | {e(w['o'])} | {e(w['lse'])} |"
        )
    return t


def run_sections(steps, out: dict, out_dir: Path, after=None) -> dict:
    """Run named steps in order; a step that raises records its traceback and the rest go
    on; results.json is rewritten after each, and `after(sections)` called (a report writer),
    so a call cut off by its limit keeps them."""
    sections, t0 = {}, time.time()
    for name, fn in steps:
        try:
            sections[name] = fn()
        except Exception:
            sections[name] = ["FAILED:", "```", traceback.format_exc(), "```"]
            print(traceback.format_exc(), flush=True)
        print(f"[{name} done at {time.time() - t0:.0f} s]", flush=True)
        torch.cuda.empty_cache()
        (out_dir / "results.json").write_text(json.dumps(out, indent=1, default=str))
        if after is not None:
            after(sections)
    return sections


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parity-budget-s", type=float, default=150.0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    out = {"stamp": stamp()}
    head = [f"{k}: {v}" for k, v in out["stamp"].items()]
    print("\n".join(head), flush=True)
    sections = run_sections(
        (
            ("extra", lambda: determinism_and_int64(out)),
            ("parity", lambda: parity_table(parity(out, args.parity_budget_s))),
            ("bench", lambda: bench(out)),
        ),
        out,
        args.out,
    )
    stamp_md = ["", "| | |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in out["stamp"].items()]
    (args.out / "parity.md").write_text(
        "\n".join(
            [
                "# Triton forward parity vs fp64 reference (SPEC.md tolerances), strict",
                *stamp_md,
                "",
                *sections.get("parity", []),
                "",
                *sections.get("extra", []),
            ]
        )
        + "\n"
    )
    (args.out / "bench.md").write_text(
        "\n".join(
            ["# Triton forward benchmark (bf16, median of event-timed call batches)", *stamp_md, "", *sections.get("bench", [])]
        )
        + "\n"
    )
    print("\n".join(sections.get("parity", []) + sections.get("extra", []) + [""] + sections.get("bench", [])))


if __name__ == "__main__":
    main()
