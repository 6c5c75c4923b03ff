"""`selgate bench <command>` (or `python -m selgate.bench <command>`): the commands are listed
below with what each does; `<command> --help` gives its options. Those marked GPU time one kernel
on the device."""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import time
from pathlib import Path

import torch

from selgate.cli import prog
from selgate.cli_args import Parser, cannot_write, choice_list, command, count, int_list, positive_int, positive_number
from selgate.kernels.config import current_device_name
from selgate.kernels.config import device_slug as config_slug

from . import outside, tables
from .args import add_device
from .baselines import METHODS, default_methods, get_method
from .inputs import DISTS, decode_problem, prefill_problem
from .presets import PRESETS, Matrix, acceptance_checks
from .sweep import MeasureOptions, retime_graph, run_sweep
from .timing import measure_limits

DTYPES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": "float32",
    "fp64": "float64",
    "float64": "float64",
}


def csv_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such results CSV")
    return path


def method_list(text: str) -> list[str]:
    """Comma list of backends; outside kernels (`package.module:callable`) load after parsing,
    once `--declare` is known (outside.load)."""
    items = [x for x in text.split(",") if x]
    try:
        for x in items:
            if not outside.is_outside(x):
                get_method(x)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return items


def add_sel(sub) -> None:
    what = "time selection attention against the baselines: one decode or prefill matrix, or a --sweep preset"
    p = command(sub, "sel", what)
    p.add_argument("--sweep", choices=sorted(PRESETS), help="run a preset matrix (ignores the shape flags)")
    p.add_argument("--decode", action="store_true", help="decode (S = 1); the default unless --T is given")
    p.add_argument("--N", type=int_list, default=[1024], help="decode rows (batch), comma list")
    p.add_argument("--H", type=int_list, default=[8], help="decode query heads per group, comma list")
    p.add_argument("--G", type=positive_int, default=1, help="decode KV groups")
    p.add_argument("--D", type=int_list, default=[128], help="key head dim, comma list")
    p.add_argument("--Dv", type=int_list, default=None, help="value head dim, comma list (default: D)")
    p.add_argument("--L-list", "--L_list", type=int_list, default=[512, 1024], help="decode selected lengths")
    p.add_argument("--S-kv", "--S_kv", type=count, default=0, help="decode context length (default 4 L)")
    p.add_argument("--dist", type=choice_list(DISTS), default=["few"], help="range layout(s): few,many,mixed")
    p.add_argument("--T", type=positive_int, help="prefill sequence length (selects prefill)")
    p.add_argument("--B", type=positive_int, default=1, help="prefill batch")
    p.add_argument("--heads", type=positive_int, default=64, help="prefill query heads (all groups)")
    p.add_argument("--groups", type=positive_int, default=4, help="prefill KV groups")
    p.add_argument("--l-sel", "--l_sel", type=positive_int, default=64, help="prefill selection block size")
    p.add_argument("--n-blocks", "--n_blocks", type=positive_int, default=16, help="prefill selected blocks per query")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="input dtype")
    p.add_argument(
        "--backends",
        type=method_list,
        help=f"comma list of {','.join(METHODS)}, "
        "Triton launch variants triton@<BLOCK_L>x<warps>x<stages> "
        "or an outside kernel package.module:callable (loaded as `selgate check` loads it) "
        f"(default: the preset's methods, else {','.join(default_methods(torch.device('cuda')))} on a GPU "
        f"and {','.join(default_methods(torch.device('cpu')))} on the CPU)",
    )
    p.add_argument(
        "--declare", type=Path, help="YAML declarations of the one outside kernel in --backends (as `selgate check --declare`)"
    )
    p.add_argument("--iters", type=positive_int, default=50, help="timed calls per (config, method) (default 50)")
    p.add_argument("--warmup", type=count, default=10, help="untimed calls first (default 10)")
    p.add_argument(
        "--max-seconds", "--max_seconds", type=positive_number, default=2.0, help="cap on timed calls per (config, method)"
    )
    p.add_argument("--budget-s", "--budget_s", type=positive_number, default=330.0, help="stop measuring after this many seconds")
    p.add_argument(
        "--graph", action="store_true", help="also time decode rows of capturable methods from a CUDA graph (graph_ms column)"
    )
    add_device(p)
    p.add_argument(
        "--out",
        type=Path,
        help="output folder (default: bench/results/<device>/<date> run in the checkout's root, "
        "else ./bench-results/<device>/<date>)",
    )
    p.add_argument("--name", help="file name stem (default: the preset, else 'sel')")


def matrices(a) -> list[Matrix]:
    """The matrices the arguments ask for."""
    dtype = DTYPES[a.dtype]
    if a.sweep:
        return PRESETS[a.sweep](dtype)
    s = MeasureOptions(warmup=a.warmup, iters=a.iters, max_seconds=a.max_seconds, graph=a.graph)
    if a.T is not None:
        if a.decode:
            raise SystemExit("--decode and --T (prefill) exclude each other")
        return [
            Matrix(
                "prefill",
                [
                    prefill_problem(a.T, a.heads, a.groups, D, Dv, a.l_sel, a.n_blocks, dtype, B=a.B)
                    for D in a.D
                    for Dv in (a.Dv or [D])
                ],
                s,
            )
        ]
    problems = [
        decode_problem(N, H, D, Dv, L, dist, dtype, G=a.G, S_kv=a.S_kv or None)
        for N in a.N
        for H in a.H
        for D in a.D
        for Dv in (a.Dv or [D])
        for L in a.L_list
        for dist in a.dist
    ]
    return [Matrix("decode", problems, s)]


def recheck(rows: list[dict], groups: list[Matrix], device, device_name: str, name: str) -> None:
    """Re-time the graph rows that exceed this matrix's committed baseline (regression.recheck_graph)."""
    from .regression import baseline_path, recheck_graph

    base = baseline_path(device_name, name)
    if device.type != "cuda" or not base.exists():
        return
    problems = {p.key: (p, m.measure) for m in groups for p in m.problems}

    def retime(row: dict) -> float:
        p, measure = problems[row["config"]]
        return retime_graph(p, row["method"], device, measure)

    n = recheck_graph(rows, tables.read_csv(base), retime)
    if n:
        print(f"re-timed the graph time of {n} rows slower than {base.name} (median of all timings kept)")


def device_name_of(device) -> str:
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def cmd_sel(a) -> int:
    device = torch.device(a.device)
    groups = matrices(a)
    device_name = device_name_of(device)
    rows, deadline = [], time.monotonic() + a.budget_s
    limits = measure_limits(device, getattr(torch, DTYPES[a.dtype]))
    for m in groups:
        methods = a.backends or list(m.methods) or default_methods(device)
        rows += run_sweep(
            m.problems,
            methods,
            device,
            limits,
            m.measure,
            device_name,
            budget_s=a.budget_s,  # as the notes name it
            deadline=deadline,
            desc=m.name,
        )
    name = a.name or a.sweep or "sel"
    recheck(rows, groups, device, device_name, name)
    csv_path, md_path = tables.write_tables(rows, a.out, name)
    print("\n".join([tables.summary(rows, [csv_path, md_path]), *acceptance_checks(rows)]))
    errors = [r for r in rows if r["status"] == "error"]
    if errors and not any(r["status"] == "ok" for r in rows):  # a failing method beside measured ones is a table entry
        print(f"nothing measured: every row failed or was skipped (the first error: {errors[0]['note']})", file=sys.stderr)
        return 1
    return 0


def cmd_thresholds(a) -> int:
    from .thresholds import derive, write_profile

    rows = [r for path in a.csv for r in tables.read_csv(path)]
    device_name = a.device or rows[0]["device"]
    sources = ", ".join(map(str, a.csv))
    result = derive(rows)
    print(result.markdown())
    if not result.per_L:
        raise SystemExit(f"{sources}: no configuration with both `sdpa` and `triton` measured; profile not written")
    if not a.dry_run:
        a.csv[0].with_suffix(".thresholds.md").write_text(result.markdown())
        from selgate.kernels.config import current_capability

        here = current_capability() if config_slug(device_name) == config_slug(current_device_name()) else None
        path = write_profile(result, device_name, source=sources, software=rows[0].get("software") or "", capability=here)
        print(f"wrote {path}")
    return 0


def cmd_kv_outer(a) -> int:
    from . import kv_outer_bars

    rows = [r for path in a.csv for r in tables.read_csv(path)]
    bars = kv_outer_bars.derive(rows)
    print(bars.markdown())
    sources = ", ".join(map(str, a.csv))
    if not bars.points:
        raise SystemExit(
            f"{sources}: no prefill configuration with both `triton_pairs` and `triton_kv_outer` measured "
            "(`sel --sweep prefill_heads`); profile not written"
        )
    if not a.dry_run:
        print(f"wrote {kv_outer_bars.write_profile(bars, a.device or rows[0]['device'], source=sources)}")
    return 0


def cmd_baseline(a) -> int:
    from .regression import baseline_path

    device_name = a.device or current_device_name()
    src = a.csv or tables.latest_csv(device_name)
    if src is None:
        raise SystemExit(f"no results CSV under {tables.RESULTS_DIR} for {device_name!r}; run `sel` first")
    dst = baseline_path(device_name, Path(src).stem)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    print(f"baseline for {device_name}: {dst} (from {src})")
    return 0


def cmd_compare(a) -> int:
    """Exit 1 when a configuration regressed, and when no baseline judges the device (its own or its class's)."""
    from selgate.kernels.config import current_capability
    from selgate.kernels.config import device_slug

    from .regression import compare_to_baseline

    device_name = a.device or current_device_name()
    capability = a.capability
    if a.device_class is None and capability is None and device_slug(device_name) == device_slug(current_device_name()):
        capability = current_capability()  # the device this runs on: its class is known
    cmp = compare_to_baseline(device_name, device_class=a.device_class, capability=capability)
    print(cmp.markdown())
    return 1 if cmp.blocking else 0


def cmd_plot(a) -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(
            "python -m selgate.bench plot needs matplotlib, an optional dependency: pip install selgate[plots]", file=sys.stderr
        )
        return 2
    from .plots import PlotError, write_plots

    try:
        lines = write_plots(a.csv, a.out)
    except PlotError as e:
        raise SystemExit(f"plot: {e}") from None
    print("\n".join(lines))
    return 0


# Benchmarks of one kernel on the device, each a module with options of its own.
DEVICE_BENCHES = {
    "triton-bwd": ("triton_bwd", "the Triton backward at 64k tokens: forward+backward, launch configs, memory (GPU)"),
    "cuda-decode": ("cuda_decode", "the CUDA decode kernel's grid against the HBM floor and packed SDPA (GPU)"),
    "host": ("host", "host time per decode call of each selection path against SDPA's, eager against CUDA graph (GPU)"),
}


def parser() -> Parser:
    p = Parser(prog=prog("python -m selgate.bench"), description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    add_sel(sub)
    what = "derive the device profile (sel_triton_min_L, block sizes) from results CSVs"
    t = command(sub, "thresholds", what)
    t.add_argument("csv", type=csv_file, nargs="+", help="results CSVs of one device (e.g. full.csv launch.csv)")
    t.add_argument("--device", help="device name or slug (default: the CSV's device column)")
    t.add_argument("--dry-run", "--dry_run", action="store_true", help="print the decision, write nothing")
    what = "derive the device profile's KV-outer route (heads, fewest query tokens) from prefill_heads CSVs"
    kv = command(sub, "kv-outer", what)
    kv.add_argument("csv", type=csv_file, nargs="+", help="results CSVs of one device with triton_pairs and triton_kv_outer rows")
    kv.add_argument("--device", help="device name or slug (default: the CSV's device column)")
    kv.add_argument("--dry-run", action="store_true", help="print the decision, write nothing")
    what = "promote a results CSV to the device's committed baseline"
    b = command(sub, "baseline", what)
    b.add_argument("csv", type=csv_file, nargs="?", help="results CSV (default: the device's latest under bench/results)")
    b.add_argument("--device", help="device name or slug (default: this machine's GPU)")
    what = "latest results vs the committed baseline (the device's, else its class's); exit 1 on a regression"
    c = command(sub, "compare", what)
    c.add_argument("--device", help="device name or slug whose latest results are compared (default: this machine's GPU)")
    c.add_argument(
        "--class",
        dest="device_class",
        help="GPU class of the device (sm90, sm89, sm80) whose baseline judges it without one of its own "
        "(default: the class of --capability, or of the current GPU when --device names it)",
    )
    c.add_argument("--capability", help="compute capability of the device, e.g. 9.0 (gives its class)")
    what = "decode and prefill PNGs from results CSVs (bench/plots.py; needs matplotlib: selgate[plots])"
    pl = command(sub, "plot", what)
    pl.add_argument(
        "--csv",
        type=csv_file,
        nargs="+",
        required=True,
        help="results CSVs of one device; a later CSV's row replaces an earlier one of the same config and method",
    )
    pl.add_argument("--out", type=Path, required=True, help="folder for the PNGs (docs/img for the docs)")
    from . import tune

    tune.add_parser(sub, DTYPES)
    for name, (_, what) in DEVICE_BENCHES.items():  # listed here; their options are their own
        command(sub, name, what, add_help=False)
    return p


def main(argv=None) -> int:
    from . import tune

    cli = parser()
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DEVICE_BENCHES:
        return importlib.import_module(f".{DEVICE_BENCHES[argv[0]][0]}", __package__).main(argv[1:]) or 0
    a = cli.parse_args(argv)
    if a.command == "tune":
        tune.normalise_args(a, DTYPES)
    if a.command == "sel":
        try:
            outside.load(a.backends or [], a.declare)
        except (ImportError, AttributeError, TypeError, ValueError, OSError) as e:
            cli.error(str(e))
        a.out = a.out or tables.results_dir(device_name_of(a.device))
    if a.command in ("sel", "plot"):  # before the timing, not as a traceback after it
        why = cannot_write(a.out)
        if why:
            cli.error(f"--out {a.out}: cannot write its files there ({why})")
    commands = {
        "sel": cmd_sel,
        "thresholds": cmd_thresholds,
        "kv-outer": cmd_kv_outer,
        "baseline": cmd_baseline,
        "compare": cmd_compare,
        "tune": tune.cmd_tune,
        "plot": cmd_plot,
    }
    return commands[a.command](a)


if __name__ == "__main__":
    sys.exit(main())
