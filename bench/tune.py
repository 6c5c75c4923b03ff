"""`python -m selgate.bench tune`: tune the Triton launch parameters ahead of time and persist them.

For every (op, kind, Dk, Dv, L bucket, dtype) asked for, build one input whose host-known L
bound (kernels/triton/tuning.py: min(S_kv, n * range_len)) falls in that bucket, with NSA
builder ranges of `range_len`-key blocks (so the true L is the bucket too), tune it, and merge
the winner into `<out-dir>/<device-slug>.json` after each key (a run cut short keeps what it
finished). Forward: `triton.autotune` over BLOCK_L x warps x stages. Backward: one factor at a
time around the defaults, then the winners combined (prefill shapes: training). Jobs run in
order decode fwd, prefill fwd, bwd; a job that would not finish within `--budget-s` (judged by
the longest job of its phase so far) is skipped and listed. The launch path then reads the file
from `configs/tuned/` (or `SELGATE_TRITON_TUNED_DIR`) with no tuning at call time.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from selgate.kernels.config import current_device_name, load_config

from .inputs import Problem, decode_problem, make_ranges

DECODE_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)
PREFILL_BUCKETS = (256, 512, 1024, 2048)
BWD_BUCKETS = (1024,)


@functools.lru_cache(maxsize=None)
def _decode_slots(L: int, dist: str, S_kv: int) -> int:
    p = decode_problem(1, 1, 8, 8, L, dist, "float32", S_kv=S_kv)
    return int(make_ranges(p, torch.Generator().manual_seed(0), "cpu").shape[3])


def range_slots(p) -> int:
    """Range slots `n` ([B, S, G, n, 2]) of a benchmark problem: a `Problem` or a results row
    (prefill: its selected blocks, from the row's config name; decode: rebuilt on the CPU)."""
    get = (lambda key: getattr(p, key, None)) if isinstance(p, Problem) else p.get
    if get("kind") == "prefill":
        if get("n_blocks"):
            return int(get("n_blocks"))
        m = re.search(r"blocks=(\d+)x\d+", str(get("config")))
        if not m:
            raise ValueError(f"{get('config')!r}: no 'blocks=<n>x<l_sel>' in a prefill configuration name")
        return int(m[1])
    return _decode_slots(int(get("L")), str(get("dist")), int(get("S_kv")))


def launch_bucket(p, rl: int | None = None) -> int:
    """The L bucket the launch path computes for problem or row `p`."""
    from selgate.kernels.triton.tuning import shape_bucket

    return shape_bucket(int(p.S_kv if isinstance(p, Problem) else p["S_kv"]), range_slots(p), rl)


@dataclass(frozen=True)
class Job:
    op: str  # fwd | bwd
    kind: str  # decode | prefill
    D: int
    Dv: int
    dtype: str
    bucket: int

    @property
    def phase(self) -> str:
        return f"{self.op}-{self.kind}"


def job_inputs(j: Job, a, device, rl: int, seed: int = 0):
    """q, k, v, normalised ranges and a description, for a job whose L bound is its bucket."""
    from selgate.reference import build_ranges

    l_sel, n = (rl, j.bucket // rl) if j.bucket >= rl else (j.bucket, 1)
    if j.kind == "decode":
        B, S, G, h = a.N, 1, a.G, a.H
        S_kv = max(4 * j.bucket, 64) if j.bucket >= rl else j.bucket
    else:
        B, S, G, h = 1, a.T, a.groups, a.heads // a.groups
        S_kv = a.T
    gen = torch.Generator(device=device).manual_seed(seed)
    dt = getattr(torch, j.dtype)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dt)

    q, k, v = randn(B, S, G, h, j.D), randn(B, G, S_kv, j.D), randn(B, G, S_kv, j.Dv)
    scores = torch.rand(B, S, G, -(-S_kv // l_sel), generator=gen, device=device)
    ranges = build_ranges(scores, G=G, l_sel=l_sel, n=n, S_kv=S_kv)
    shape = f"B={B} S={S} G={G} h={h} S_kv={S_kv} n={n} l_sel={l_sel}"
    return q, k, v, ranges, shape


def run_job(j: Job, a, device, rl: int) -> dict:
    from selgate.kernels.config import load_config
    from selgate.kernels.triton import tuning
    from selgate.kernels.triton.bwd import default_config, triton_backward
    from selgate.kernels.triton.fwd import _sel_fwd_kernel, triton_forward

    q, k, v, ranges, shape = job_inputs(j, a, device, rl)
    kind = tuning.kind_of(device, q.shape[1])  # what the launch path calls it ("interpreter" on CPU)
    scale = j.D**-0.5
    bench = tuning.device_bench(device, warmup_ms=a.warmup_ms, rep_ms=a.rep_ms)
    if j.op == "fwd":
        b = tuning.shape_bucket(k.shape[2], ranges.shape[3], rl)
        assert b == j.bucket, (b, j)
        default, _ = tuning.profile_fwd_config(load_config(), j.D, j.Dv, q.element_size(), kind, b)
        res = tuning.tune_fwd(
            lambda kern: triton_forward(q, k, v, ranges, scale=scale, _tuner=kern),
            kernel=_sel_fwd_kernel,
            default=default,
            space=a.fwd_space,
            do_bench=bench,
        )
    else:
        o, lse = triton_forward(q, k, v, ranges, scale=scale)
        do = torch.randn_like(o)
        default = default_config(j.D, j.Dv, q.dtype)
        res = tuning.tune_bwd(
            lambda c: triton_backward(q, k, v, o, lse, do, ranges, scale=scale, config=c),
            default=default,
            axes=a.bwd_axes,
            do_bench=bench,
        )
    return {
        "op": j.op,
        "kind": kind,
        "Dk": j.D,
        "Dv": j.Dv,
        "L_bucket": j.bucket,
        "dtype": j.dtype,
        "config": res["config"],
        "ms": res["ms"],
        "default_config": default,
        "default_ms": res["default_ms"],
        "candidates": len(res["timings"]),
        "shape": shape,
    }


def plan(a, rl: int) -> list[Job]:
    """The jobs the arguments ask for; prefill buckets below `rl` (unreachable: S_kv = T) are left out."""
    phases = [x for x in ("decode", "prefill", "bwd") if getattr(a, x)] or ["decode", "prefill", "bwd"]
    dims = [(D, Dv) for D in a.D for Dv in (a.Dv or [D])]
    jobs = []
    for phase in phases:
        op, kind, buckets = {
            "decode": ("fwd", "decode", a.decode_buckets),
            "prefill": ("fwd", "prefill", a.prefill_buckets),
            "bwd": ("bwd", "prefill", a.bwd_buckets),
        }[phase]
        if op == "fwd" and load_config()["triton_fwd"][kind].get("tma"):
            print(
                f"{phase}: skipped, the profile runs it through tensor descriptors (TMA), which the tuner "
                "does not time; its parameters stay the profile's"
            )
            continue
        jobs += [Job(op, kind, D, Dv, dt, b) for D, Dv in dims for dt in a.dtypes for b in buckets if kind == "decode" or b >= rl]
    return jobs


def _fmt_cfg(c: dict) -> str:
    if "BLOCK_L" in c:
        return f"{c['BLOCK_L']}x{c['num_warps']}x{c['num_stages']}"
    return ",".join(f"{k}={v}" for k, v in c.items())


def _ms(x) -> str:
    return "n/a" if x is None or x != x or x == float("inf") else f"{x:.4f}"


def markdown(entries: list[dict], skipped: list[str], failed: list[str], header: str) -> str:
    lines = [
        header,
        "",
        "| op | kind | Dk | Dv | dtype | L bucket | tuned | ms | default | default ms | speedup |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in entries:
        sp = f"{e['default_ms'] / e['ms']:.2f}x" if e["ms"] and e["default_ms"] else "n/a"
        lines.append(
            f"| {e['op']} | {e['kind']} | {e['Dk']} | {e['Dv']} | {e['dtype']} | {e['L_bucket']} | "
            f"{_fmt_cfg(e['config'])} | {_ms(e['ms'])} | {_fmt_cfg(e['default_config'])} | "
            f"{_ms(e['default_ms'])} | {sp} |"
        )
    if skipped:
        lines += ["", f"Skipped (time budget): {len(skipped)}", *[f"- {s}" for s in skipped]]
    if failed:
        lines += ["", f"Failed: {len(failed)}", *[f"- {s}" for s in failed]]
    return "\n".join(lines) + "\n"


def verify(path: Path, entries: list[dict], rl: int) -> str:
    """Point the launch path at `path` and check it picks every entry just tuned."""
    import os

    from selgate.kernels.triton import tuning
    from selgate.kernels.triton.bwd import launch_config as bwd_config
    from selgate.kernels.triton.fwd import launch_config as fwd_config

    saved = {k: v for k, v in os.environ.items() if k == tuning.ENV_TUNED_DIR}  # restored below
    os.environ[tuning.ENV_TUNED_DIR] = str(path.parent)
    tuning.clear_cache()
    try:
        ok = 0
        for e in entries:
            dt = getattr(torch, e["dtype"])
            n = max(e["L_bucket"] // rl, 1)
            if e["op"] == "fwd":
                got = fwd_config(e["Dk"], e["Dv"], dt.itemsize, e["kind"], dtype=dt, S_kv=e["L_bucket"], n=n)
            else:
                got = bwd_config(e["Dk"], e["Dv"], dt, S_kv=e["L_bucket"], n=n, kind=e["kind"])
            picked = all(got.get(key) == val for key, val in e["config"].items())
            ok += picked and tuning.last_choice(e["op"])[2].startswith("tuned")
        return f"verify: the launch path picks {ok}/{len(entries)} tuned entries from {path}"
    finally:
        os.environ.pop(tuning.ENV_TUNED_DIR, None)
        os.environ.update(saved)
        tuning.clear_cache()


def cmd_tune(a) -> int:
    from selgate.kernels.triton import tuning

    device = torch.device(a.device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else current_device_name()
    rl = tuning.range_len()
    path = tuning.tuned_path(device_name, a.out_dir)
    jobs = plan(a, rl)
    start, longest = time.monotonic(), {}
    done, skipped, failed = [], [], []
    print(
        f"tuning {len(jobs)} keys on {device_name} (triton {tuning.triton_version()}), budget {a.budget_s:.0f} s, "
        f"range_len {rl} -> {path}",
        flush=True,
    )
    for j in jobs:
        elapsed = time.monotonic() - start
        if elapsed + longest.get(j.phase, 0.0) > a.budget_s:
            skipped.append(f"{j}")
            continue
        t0 = time.monotonic()
        try:
            e = run_job(j, a, device, rl)
        except Exception as ex:  # one key failing is a line in the report, not the end of the run
            failed.append(f"{j}: {type(ex).__name__}: {str(ex).splitlines()[0][:200] if str(ex) else ''}")
            print(f"  FAILED {failed[-1]}", flush=True)
        else:
            done.append(e)
            tuning.write_tuned(path, [e], device_name=device_name, extra={"command": "python -m selgate.bench tune"})
            print(
                f"  {j.op} {j.kind} D={j.D} Dv={j.Dv} {j.dtype} L<={j.bucket}: {_fmt_cfg(e['config'])} "
                f"{_ms(e['ms'])} ms (default {_fmt_cfg(e['default_config'])} {_ms(e['default_ms'])} ms) "
                f"[{time.monotonic() - t0:.1f} s]",
                flush=True,
            )
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        longest[j.phase] = max(longest.get(j.phase, 0.0), time.monotonic() - t0)
    header = (
        f"# Tuned launch parameters: {device_name}, triton {tuning.triton_version()}, "
        f"torch {torch.__version__}\n\n{len(done)} of {len(jobs)} keys tuned in "
        f"{time.monotonic() - start:.0f} s; file {path}."
    )
    md = markdown(done, skipped, failed, header)
    if done:
        path.with_suffix(".md").write_text(md)
        md += "\n" + verify(path, done, rl) + "\n"
    print(md)
    return 1 if failed and not done else 0


def _axes(text: str) -> dict:
    from selgate.kernels.triton.tuning import BWD_KEYS

    out = {}
    for part in filter(None, text.split(";")):
        key, _, vals = part.partition("=")
        if key.strip() not in BWD_KEYS:
            raise ValueError(f"{key!r}: expected one of {BWD_KEYS}")
        out[key.strip()] = tuple(int(x) for x in vals.split(",") if x)
    return out


def add_parser(sub, dtypes: dict) -> None:
    from selgate.cli_args import choice_list, command, int_list, positive_int, positive_number
    from selgate.kernels import config

    from .args import add_device

    what = "tune Triton launch parameters ahead of time; writes configs/tuned/<device>.json"
    p = command(sub, "tune", what)
    p.add_argument("--decode", action="store_true", help="forward, decode shapes (default: all phases)")
    p.add_argument("--prefill", action="store_true", help="forward, prefill shapes")
    p.add_argument("--bwd", action="store_true", help="backward, prefill shapes")
    p.add_argument("--D", type=int_list, default=[64, 128], help="key head dims, comma list")
    p.add_argument("--Dv", type=int_list, default=None, help="value head dims (default: each D)")
    p.add_argument(
        "--dtype", dest="dtypes", type=choice_list(dtypes), default=["bf16", "fp16"], help="comma list of bf16,fp16,fp32"
    )
    p.add_argument(
        "--decode-buckets", "--decode_buckets", type=int_list, default=list(DECODE_BUCKETS), help="decode L buckets to tune"
    )
    p.add_argument(
        "--prefill-buckets", "--prefill_buckets", type=int_list, default=list(PREFILL_BUCKETS), help="prefill L buckets to tune"
    )
    p.add_argument("--bwd-buckets", "--bwd_buckets", type=int_list, default=list(BWD_BUCKETS), help="backward L buckets to tune")
    p.add_argument("--N", type=positive_int, default=1024, help="decode batch")
    p.add_argument("--H", type=positive_int, default=8, help="decode query heads per group")
    p.add_argument("--G", type=positive_int, default=1, help="decode KV groups")
    p.add_argument("--T", type=positive_int, default=16384, help="prefill length")
    p.add_argument("--heads", type=positive_int, default=64, help="prefill query heads (all groups)")
    p.add_argument("--groups", type=positive_int, default=4, help="prefill KV groups")
    p.add_argument(
        "--fwd-space",
        "--fwd_space",
        type=lambda s: [tuple(int(x) for x in c.split("x")) for c in s.split(",") if c],
        default=None,
        help="forward candidates BLOCK_LxWARPSxSTAGES, comma list (default: tuning.FWD_SPACE)",
    )
    p.add_argument(
        "--bwd-axes",
        "--bwd_axes",
        type=_axes,
        default=None,
        help="backward axes, e.g. 'block_n=32,64;warps=4,8' (default: tuning.BWD_AXES)",
    )
    p.add_argument(
        "--warmup-ms", "--warmup_ms", type=positive_number, default=10.0, help="triton.testing.do_bench warm-up per candidate, ms"
    )
    p.add_argument(
        "--rep-ms",
        "--rep_ms",
        type=positive_number,
        default=40.0,
        help="triton.testing.do_bench timed repetitions per candidate, ms",
    )
    p.add_argument(
        "--budget-s", "--budget_s", type=positive_number, default=480.0, help="stop starting new keys after this many seconds"
    )
    p.add_argument(
        "--out-dir",
        "--out_dir",
        dest="out_dir",
        type=Path,
        default=None,
        help=f"folder of <device-slug>.json (default {config.CONFIG_DIR / 'tuned'})",
    )
    add_device(p)


def normalise_args(a, dtypes: dict) -> None:
    from selgate.kernels.triton import tuning

    a.dtypes = [dtypes[d] for d in a.dtypes]
    a.fwd_space = a.fwd_space or list(tuning.FWD_SPACE)
    a.bwd_axes = a.bwd_axes or dict(tuning.BWD_AXES)
    a.out_dir = a.out_dir or tuning.tuned_dir()
