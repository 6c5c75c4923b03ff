"""Performance plots from results CSVs: `python -m selgate.bench plot --csv <csv>... --out docs/img`.

Files (fixed names, so docs can embed them):
  decode_ms_vs_L.png            decode time per call against L (selected keys per query)
  decode_hbm_fraction_vs_L.png  the same rows as the achieved fraction of the HBM floor (`frac_copy`)
  prefill_ms_vs_T.png           prefill time per call against the sequence length T
  prefill_ms_vs_h.png           prefill time per call against h, the query heads per KV head, one
                                panel per T, with the floor of each problem (`prefill_floor_ms`)

Decode: one configuration family (N, G, h, D, Dv, dtype; one panel per range layout `dist`),
the family with the most (dist, L) points, ties to bf16 and then the largest shape (on the
full sweep: the acceptance shape N=1024 h=8 D=Dv=128). `frac_copy` is the row's useful bytes
(selected K/V plus q and o) over its time, as a fraction of the copy bandwidth measured in
the same run (bench/sweep.py): 1.0 is the HBM floor, 1/1.5 the acceptance bar. Solid and
dashed lines are back-to-back eager calls (the host's issue time counts where it exceeds the
device's); dotted lines are the same calls replayed from a CUDA graph (`graph_ms`, the device
time), where the CSV has them. Prefill: the family (B, G, h, D, Dv, blocks, dtype) with the
most T values, K and V as separate tensors; with fewer than two T values the plot is skipped
(`--sweep prefill_scaling` measures five). Prefill against h: the family (B, G, D, Dv, blocks,
dtype) with the most (T, h) points, as `--sweep prefill_heads` measures it; skipped with fewer
than two h at any T.

Rows of several CSVs are merged (a later CSV's row replaces an earlier one of the same
configuration and method); they must come from one device. Every title names the device
and the software stamps of the rows it draws. Output is deterministic (the same CSVs give the
same bytes): matplotlib's default style whatever the local matplotlibrc, no PNG `Software`
stamp; PNGs are 110 dpi, palette images of ~50 KB.
"""

from __future__ import annotations

import contextlib
import csv
import io
import re
from collections import defaultdict
from pathlib import Path

from . import tables
from .inputs import DISTS

DECODE_MS = "decode_ms_vs_L.png"
DECODE_FRAC = "decode_hbm_fraction_vs_L.png"
PREFILL_MS = "prefill_ms_vs_T.png"
PREFILL_HEADS_MS = "prefill_ms_vs_h.png"
ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
DPI = 110

# Columns the plots read; `graph_ms` and `kv_layout` are optional (older CSVs lack them).
REQUIRED = (
    "config",
    "kind",
    "dtype",
    "B",
    "S",
    "G",
    "h",
    "D",
    "Dv",
    "S_kv",
    "L",
    "dist",
    "method",
    "status",
    "ms",
    "frac_copy",
    "device",
    "software",
)

# method: (colour, line style, marker, line width). Ours first (solid), then the baselines.
STYLE = {
    "triton": ("C0", "-", "o", 2.2),
    "cuda": ("C1", "-", "s", 2.2),
    "sdpa": ("C2", "--", "^", 1.4),
    "masked_sdpa": ("C3", "--", "v", 1.4),
    "gather_sdpa": ("C4", "--", "D", 1.4),
    "fla_nsa": ("C5", "--", "P", 1.4),
    "dense_causal": ("C7", "-.", "x", 1.4),
}
LABEL = {
    "sdpa": "sdpa (packed fallback)",
    "masked_sdpa": "masked_sdpa (dense + mask)",
    "gather_sdpa": "gather_sdpa (gather, then SDPA)",
    "fla_nsa": "fla_nsa (fla-core parallel_nsa)",
    "dense_causal": "dense_causal (every key; yardstick)",
}


class PlotError(ValueError):
    """Input the plots cannot use (a missing column, rows of several devices)."""


def _header(path: Path) -> list[str]:
    try:
        with Path(path).open(newline="") as f:
            return next(csv.reader(f), [])
    except OSError as e:
        raise PlotError(f"{path}: {e.strerror or e}") from None


def load(paths) -> list[dict]:
    """Rows of the CSVs, a later CSV's row replacing an earlier one of the same (config, method)."""
    merged: dict[tuple[str, str], dict] = {}
    for path in paths:
        missing = [c for c in REQUIRED if c not in _header(path)]
        if missing:
            raise PlotError(
                f"{path}: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                f"(the plots read {', '.join(REQUIRED)})"
            )
        try:
            rows = tables.read_csv(path)
        except ValueError as e:
            raise PlotError(str(e)) from None
        for r in rows:
            merged[(r["config"], r["method"])] = r
    rows = list(merged.values())
    devices = sorted({r["device"] for r in rows})
    if len(devices) > 1:
        raise PlotError(f"rows of {len(devices)} devices ({'; '.join(devices)}): plot one device at a time")
    return rows


OTHER_COLOURS = ("C6", "C8", "C9", "k", "tab:olive", "tab:cyan")  # methods STYLE does not name: a user's kernel, launch variants
OTHER_MARKERS = ("*", "h", "X", "d", "p", "<")


def _style_of(method: str, others: list[str]) -> tuple:
    """STYLE's entry, else the next of OTHER_COLOURS, solid and thick: a benchmarked kernel of the
    user's (`mymod:fn`) or a launch variant (`triton@64x4x2`) is drawn as one of ours."""
    if method in STYLE:
        return STYLE[method]
    i = others.index(method) % len(OTHER_COLOURS)
    return OTHER_COLOURS[i], "-", OTHER_MARKERS[i], 2.0


def _plotted(r: dict) -> bool:
    return r["status"] == "ok" and r["ms"] is not None and r.get("kv_layout") in (None, "", "separate")


def _stamp(rows: list[dict]) -> str:
    """'<device> · <software>[ | <software>...]' of the rows drawn, commits cut to 12 digits (the
    line fits the figure; the CSV keeps the full id)."""
    software = " | ".join(sorted({r["software"] or "software not stamped" for r in rows}))
    return re.sub(r"\b([0-9a-f]{12})[0-9a-f]{28}\b", r"\1", f"{rows[0]['device']} · {software}")


def _blocks(r: dict) -> str:
    m = re.search(r"blocks=(\d+x\d+)", r["config"])
    return m[1] if m else f"L={r['L']}"


def _pick(families: dict) -> tuple:
    """The family with the most points, then the most rows, then bf16, then the largest shape."""

    def rank(key):
        rows = families[key]
        points = {(r["dist"], r["L"], r["S"]) for r in rows}
        B, G, h, D, Dv = key[:5]
        return len(points), len(rows), rows[0]["dtype"] == "bfloat16", B * G * h, D + Dv, repr(key)

    return max(families, key=rank)


def decode_family(rows: list[dict]) -> list[dict]:
    families = defaultdict(list)
    for r in rows:
        if r["kind"] == "decode" and _plotted(r):
            families[(r["B"], r["G"], r["h"], r["D"], r["Dv"], r["dtype"])].append(r)
    return families[_pick(families)] if families else []


def prefill_family(rows: list[dict]) -> list[dict]:
    families = defaultdict(list)
    for r in rows:
        if r["kind"] == "prefill" and _plotted(r):
            families[(r["B"], r["G"], r["h"], r["D"], r["Dv"], _blocks(r), r["dtype"])].append(r)
    return families[_pick(families)] if families else []


def _describe_decode(fam: list[dict]) -> str:
    r = fam[0]
    ratios = {r2["S_kv"] / r2["L"] for r2 in fam}
    s_kv = f"S_kv={ratios.pop():g}L" if len(ratios) == 1 else "S_kv " + ",".join(map(str, sorted({x["S_kv"] for x in fam})))
    return f"decode N={r['B']} G={r['G']} h={r['h']} D={r['D']} Dv={r['Dv']} {r['dtype']}, {s_kv}"


def _describe_prefill(fam: list[dict]) -> str:
    r = fam[0]
    n, l_sel = _blocks(r).split("x") if "x" in _blocks(r) else ("?", "?")
    return f"prefill B={r['B']} G={r['G']} h={r['h']} D={r['D']} Dv={r['Dv']}, {n} blocks of {l_sel} keys per query, {r['dtype']}"


@contextlib.contextmanager
def _style():
    """matplotlib's default style whatever the local matplotlibrc says, and a fixed SVG hash salt."""
    import matplotlib as mpl
    import matplotlib.style

    with (
        mpl.style.context("default"),
        mpl.rc_context(
            {"svg.hashsalt": "selgate", "axes.titlesize": 10, "axes.labelsize": 9, "xtick.labelsize": 8, "ytick.labelsize": 8}
        ),
    ):
        yield


def _figure(panels: int, title: str, width: float):
    from matplotlib.figure import Figure

    import textwrap

    fig = Figure(figsize=(width, 4.6), layout="constrained")
    axes = fig.subplots(1, panels, sharey=True, squeeze=False)[0]
    # each title line wrapped to the figure's width: 9.5-point DejaVu Sans sets about 14
    # characters an inch, 12 leaves room for wide ones (at 15, a one-panel decode figure's
    # configuration line ran past both edges); a long software stamp is never cut either
    chars = int(width * 12)
    fig.suptitle("\n".join(textwrap.fill(line, chars) for line in title.split("\n")), fontsize=9.5)
    return fig, axes


def _log_axes(ax, xs: list[int], x_label: str, y_format) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{x // 1024}k" if x >= 4096 and x % 1024 == 0 else str(x) for x in xs])
    # labelled ticks at 1, 2 and 5 times each power of ten, at every integer multiple where the
    # data spans less than a decade (the bare log axis then had no labelled tick at all)
    low, high = ax.dataLim.intervaly
    narrow = low > 0 and high / low < 10
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=tuple(range(1, 10)) if narrow else (1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(y_format))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(x_label)
    ax.grid(True, which="major", alpha=0.3)


def _legend(fig, axes) -> None:
    seen = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    fig.legend(
        list(seen.values()),
        list(seen),
        loc="outside lower center",
        ncols=min(len(seen), 5 if len(axes) > 1 else 3),
        fontsize=8,
        frameon=False,
    )


def _lines(ax, points: dict[str, list[tuple]], graph: bool) -> None:
    """points: method -> [(x, eager y, graph y or None)], drawn in STYLE order, then the other
    methods by name."""
    others = sorted(m for m in points if m not in STYLE)
    for method in [*STYLE, *others]:
        pts = sorted(points.get(method, []))
        if not pts:
            continue
        color, ls, marker, lw = _style_of(method, others)
        has_graph = graph and any(p[2] is not None for p in pts)
        label = LABEL.get(method, method) + (", eager" if has_graph else "")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, ls=ls, marker=marker, lw=lw, ms=4.5, label=label)
        if has_graph:
            g = [(p[0], p[2]) for p in pts if p[2] is not None]
            ax.plot(
                [p[0] for p in g],
                [p[1] for p in g],
                color=color,
                ls=":",
                marker=marker,
                mfc="none",
                lw=lw * 0.8,
                ms=4.5,
                label=f"{method}, CUDA graph",
            )


def _dists(fam: list[dict]) -> list[str]:
    present = {r["dist"] for r in fam}
    return [d for d in DISTS if d in present] + sorted(present - set(DISTS))


def _ms(y, _pos) -> str:
    return f"{y:g}"


def _percent(y, _pos) -> str:
    return f"{100 * y:g}%"


def decode_figures(rows: list[dict]) -> dict:
    """{file name: (Figure, what it shows)} of the decode plots ({} without measured decode rows)."""
    fam = decode_family(rows)
    if not fam:
        return {}
    dists = _dists(fam)
    width = 1.0 + 4.0 * len(dists)
    what = f"{_describe_decode(fam)}; solid/dashed: eager calls, dotted: CUDA-graph replay (device time)"
    figs = {}
    for name, title, y_label in (
        (DECODE_MS, "Decode selection attention: time per call against L", "ms per call"),
        (DECODE_FRAC, "Decode selection attention: achieved fraction of the HBM floor against L", "fraction of the HBM floor"),
    ):
        fig, axes = _figure(len(dists), f"{title}\n{what}\n{_stamp(fam)}", max(width, 7.5))
        for ax, dist in zip(axes, dists):
            points = defaultdict(list)
            for r in fam:
                if r["dist"] != dist:
                    continue
                if name == DECODE_MS:
                    points[r["method"]].append((r["L"], r["ms"], r.get("graph_ms")))
                elif r["frac_copy"] is not None:
                    g = r.get("graph_ms")
                    points[r["method"]].append((r["L"], r["frac_copy"], g and r["frac_copy"] * r["ms"] / g))
            if name == DECODE_FRAC:
                ax.axhline(1.0, color="k", lw=0.9, alpha=0.6, label="HBM floor (measured copy bandwidth)")
                ax.axhline(
                    1 / 1.5, color="k", lw=0.9, ls=(0, (1, 2)), alpha=0.6, label="acceptance bar: 1.5x the floor (L 512, 1024)"
                )
            _lines(ax, points, graph=True)
            _log_axes(
                ax,
                sorted({r["L"] for r in fam if r["dist"] == dist}),
                "L (selected keys per query)",
                _ms if name == DECODE_MS else _percent,
            )
            ax.set_title(f"dist={dist}")
        axes[0].set_ylabel(y_label)
        if name == DECODE_FRAC:
            low = min(r["frac_copy"] for r in fam if r["frac_copy"] is not None)
            axes[0].set_ylim(low / 1.5, 1.4)
        _legend(fig, axes)
        figs[name] = fig, f"{_describe_decode(fam)}, dist {'/'.join(dists)}"
    return figs


def prefill_figure(rows: list[dict]):
    """(Figure, what it shows), or (None, why there is none)."""
    fam = prefill_family(rows)
    if not fam:
        return None, "no measured prefill rows in the CSVs"
    Ts = sorted({r["S"] for r in fam})
    if len(Ts) < 2:
        return None, (
            f"the prefill rows hold one sequence length (T={Ts[0]}, {_describe_prefill(fam)}); a plot "
            "against T needs at least two (`python -m selgate.bench sel --sweep prefill_scaling` on the GPU, "
            "then pass its CSV too)"
        )
    fig, axes = _figure(
        1,
        "Prefill selection attention (forward): time per call against T\n"
        f"{_describe_prefill(fam)}, separate K and V\n{_stamp(fam)}",
        8.0,
    )
    points = defaultdict(list)
    for r in fam:
        points[r["method"]].append((r["S"], r["ms"], None))
    _lines(axes[0], points, graph=False)
    _log_axes(axes[0], Ts, "T (sequence length)", _ms)
    axes[0].set_ylabel("ms per call")
    _legend(fig, axes)
    return fig, _describe_prefill(fam) + ", T " + "/".join(map(str, Ts))


def prefill_floor_ms(r: dict):
    """The least time the prefill problem of row `r` can take on the device of its run: its math
    (2 x selected keys x h x (D + Dv) flops, from the row's rate) at the matmul rate measured in
    the same run, or its unique bytes (each K and V row once, q in, o out) at the copy rate
    measured in the same run, whichever is more (None where the row lacks a rate). A forward that
    re-reads each row's selected keys costs the same at every h; this floor grows with h."""
    if None in (r.get("tflops"), r.get("matmul_tflops"), r.get("copy_gbps")) or r["dtype"] not in ITEM_BYTES:
        return None
    item = ITEM_BYTES[r["dtype"]]
    flops = r["tflops"] * r["ms"] * 1e9
    unique = (r["B"] * r["S_kv"] * r["G"] + r["B"] * r["S"] * r["G"] * r["h"]) * (r["D"] + r["Dv"]) * item
    return max(flops / (r["matmul_tflops"] * 1e9), unique / (r["copy_gbps"] * 1e6))


def heads_family(rows: list[dict]) -> list[dict]:
    """Prefill rows differing in T and h alone: the family with the most (T, h) points."""
    families = defaultdict(list)
    for r in rows:
        if r["kind"] == "prefill" and _plotted(r):
            families[(r["B"], r["G"], r["D"], r["Dv"], _blocks(r), r["dtype"])].append(r)
    if not families:
        return []
    return max(families.values(), key=lambda fam: (len({(r["S"], r["h"]) for r in fam}), len(fam)))


def prefill_heads_figure(rows: list[dict]):
    """(Figure, what it shows), or (None, why there is none): ms against h, one panel per T."""
    fam = heads_family(rows)
    Ts = sorted({r["S"] for r in fam if len({x["h"] for x in fam if x["S"] == r["S"]}) >= 2})
    if not Ts:
        return None, (
            "no prefill rows with two or more h at one T (`python -m selgate.bench sel --sweep prefill_heads` "
            "on the GPU, then pass its CSV)"
        )
    r = fam[0]
    n, l_sel = _blocks(r).split("x") if "x" in _blocks(r) else ("?", "?")
    what = f"prefill B={r['B']} G={r['G']} D={r['D']} Dv={r['Dv']}, {n} blocks of {l_sel} keys per query, {r['dtype']}"
    fig, axes = _figure(
        len(Ts),
        f"Prefill selection attention (forward): time per call against h, query heads per KV head\n{what}\n{_stamp(fam)}",
        3.6 * len(Ts) + 1.2,
    )
    hs = sorted({x["h"] for x in fam if x["S"] in Ts})
    for ax, T in zip(axes, Ts):
        points, floor = defaultdict(list), {}
        for x in (x for x in fam if x["S"] == T):
            points[x["method"]].append((x["h"], x["ms"], None))
            least = prefill_floor_ms(x)
            if least is not None:
                floor.setdefault(x["h"], least)
        _lines(ax, points, graph=False)
        if floor:
            ax.plot(sorted(floor), [floor[h] for h in sorted(floor)], color="k", ls=":", lw=1.4, label=FLOOR_LABEL)
        _log_axes(ax, hs, "h (query heads per KV head)", _ms)
        ax.set_title(f"T = {T // 1024}k" if T % 1024 == 0 else f"T = {T}")
    axes[0].set_ylabel("ms per call")
    _legend(fig, axes)
    return fig, f"{what}, T {'/'.join(map(str, Ts))}, h {'/'.join(map(str, hs))}"


FLOOR_LABEL = "floor: math at the run's matmul rate or unique bytes at its copy rate"


def _save(fig, path: Path) -> None:
    """Agg-rendered PNG, without matplotlib's `Software` stamp, cut to a 256-colour palette (no
    dithering: the plots hold a few flat colours, so this is lossless to the eye and ~3x smaller)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image  # a dependency of matplotlib

    FigureCanvasAgg(fig)  # the Agg backend, without pyplot's global state
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    with Image.open(buf) as img:
        img.convert("RGB").quantize(colors=256, dither=Image.Dither.NONE).save(path, format="png", optimize=True)


def write_plots(csvs, out: Path) -> list[str]:
    """Write the PNGs under `out`; one line per file written or skipped."""
    rows = load(csvs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    with _style():
        figs = decode_figures(rows)
        if not figs:
            lines.append(f"skipped {DECODE_MS}, {DECODE_FRAC}: no measured decode rows in the CSVs")
        fig, text = prefill_figure(rows)
        if fig is None:
            lines.append(f"skipped {PREFILL_MS}: {text}")
        else:
            figs[PREFILL_MS] = fig, text
        fig, text = prefill_heads_figure(rows)
        if fig is None:
            lines.append(f"skipped {PREFILL_HEADS_MS}: {text}")
        else:
            figs[PREFILL_HEADS_MS] = fig, text
        for name, (fig, what) in figs.items():
            path = out / name
            _save(fig, path)
            lines.append(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB): {what}")
    return lines
