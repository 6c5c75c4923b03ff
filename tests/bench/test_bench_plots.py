"""`python -m selgate.bench plot`: PNGs from results CSVs (a few synthetic rows under the real
column names), the skipped prefill plot, a missing column, matplotlib missing; and the
`prefill_scaling` preset that feeds the prefill plot."""

from __future__ import annotations

import csv
import dataclasses
import sys

import pytest

import torch

from selgate.bench import tables
from selgate.bench.baselines import get_method
from selgate.bench.__main__ import main
from selgate.bench.inputs import decode_problem
from selgate.bench.presets import PRESETS, PREFILL_SCALING_T, acceptance_prefill

PNG = b"\x89PNG\r\n\x1a\n"
DEVICE = "NVIDIA H100 80GB HBM3"
SOFTWARE = "torch 2.11.0 triton 3.6.0 driver 580.159.04 commit abc1234"
DECODE = ("decode_ms_vs_L.png", "decode_hbm_fraction_vs_L.png")
PREFILL = "prefill_ms_vs_T.png"


@pytest.fixture
def mpl():
    return pytest.importorskip("matplotlib")


def row(p, method: str, ms: float, *, status: str = "ok", **fields) -> dict:
    base = dataclasses.asdict(p)
    del base["l_sel"], base["n_blocks"]
    r = {
        "config": p.key,
        **base,
        "method": method,
        "ours": method in ("triton", "cuda", "sdpa"),
        "status": status,
        "device": DEVICE,
        "software": SOFTWARE,
        "copy_gbps": 3000.0,
        "matmul_tflops": 800.0,
    }
    if status == "ok":
        r.update(ms=ms, ms_lo=ms * 0.98, ms_hi=ms * 1.02, iters=15, frac_copy=min(0.02 / ms, 0.97))
    return {**r, **fields}


def decode_rows() -> list[dict]:
    rows = []
    for dist in ("few", "many"):
        for L in (16, 64, 256):
            p = decode_problem(64, 4, 64, 64, L, dist, "bfloat16")
            rows += [
                row(p, "triton", 0.1 + L / 4000, graph_ms=0.01 + L / 5000),
                row(p, "cuda", 0.03 + L / 5000, graph_ms=0.01 + L / 5000),
                row(p, "sdpa", 1.2 + L / 1000),
                row(p, "gather_sdpa", 0.5 + L / 500),
                row(p, "dense_causal", 0.0, status="skip", note="prefill only"),
            ]
    return rows


def prefill_rows(Ts) -> list[dict]:
    rows = []
    for T in Ts:
        p = acceptance_prefill("bfloat16", T)
        rows += [
            row(p, "triton", 15.6 * T / 65536),
            row(p, "fla_nsa", 21.4 * T / 65536),
            row(p, "sdpa", 473.5 * T / 65536),
            row(p, "dense_causal", 112.8 * (T / 65536) ** 2),
            row(p, "masked_sdpa", 5.0) if T == 4096 else row(p, "masked_sdpa", 0.0, status="skip"),
        ]
    return rows


def plot(capsys, out, *csvs) -> str:
    assert main(["plot", "--csv", *map(str, csvs), "--out", str(out)]) == 0
    return capsys.readouterr().out


def assert_png(path) -> bytes:
    data = path.read_bytes()
    assert data.startswith(PNG) and 10_000 < len(data) < 200_000, (path, len(data))
    return data


def test_decode_plots_written_and_a_single_T_prefill_skipped(mpl, tmp_path, capsys):
    csv_path = tables.write_csv(decode_rows() + prefill_rows([65536]), tmp_path / "run.csv")
    out = plot(capsys, tmp_path / "img", csv_path)
    for name in DECODE:
        assert_png(tmp_path / "img" / name)
        assert f"wrote {tmp_path / 'img' / name} (" in out
    assert not (tmp_path / "img" / PREFILL).exists()
    assert f"skipped {PREFILL}: the prefill rows hold one sequence length (T=65536" in out
    assert "--sweep prefill_scaling" in out


def test_prefill_plot_from_a_second_csv_and_identical_bytes_on_rerun(mpl, tmp_path, capsys):
    first = tables.write_csv(decode_rows() + prefill_rows([65536]), tmp_path / "full.csv")
    scaling = tables.write_csv(prefill_rows(PREFILL_SCALING_T), tmp_path / "prefill_scaling.csv")
    out = plot(capsys, tmp_path / "a", first, scaling)
    assert f"wrote {tmp_path / 'a' / PREFILL} (" in out and "T 4096/8192/16384/32768/65536" in out
    plot(capsys, tmp_path / "b", first, scaling)
    for name in (*DECODE, PREFILL):
        assert assert_png(tmp_path / "a" / name) == (tmp_path / "b" / name).read_bytes(), name


def test_titles_name_the_device_and_software(mpl, tmp_path):
    from selgate.bench import plots

    rows = plots.load([tables.write_csv(decode_rows() + prefill_rows([4096, 8192]), tmp_path / "run.csv")])
    with plots._style():
        figs = plots.decode_figures(rows)
        figs[PREFILL] = plots.prefill_figure(rows)
    assert set(figs) == {*DECODE, PREFILL}
    for fig, _ in figs.values():
        title = fig.get_suptitle()
        assert DEVICE in title and SOFTWARE in title


def test_a_missing_column_is_named(mpl, tmp_path, capsys):
    path = tmp_path / "old.csv"
    columns = [c for c in tables.COLUMNS if c != "frac_copy"]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(decode_rows())
    with pytest.raises(SystemExit) as e:
        main(["plot", "--csv", str(path), "--out", str(tmp_path / "img")])
    assert f"{path}: missing column frac_copy" in str(e.value.code)
    assert not (tmp_path / "img").exists()


def test_rows_of_two_devices_are_refused(mpl, tmp_path):
    a = tables.write_csv(decode_rows(), tmp_path / "a.csv")
    b = tables.write_csv([dict(r, device="NVIDIA A100-SXM4-80GB") for r in prefill_rows([4096, 8192])], tmp_path / "b.csv")
    with pytest.raises(SystemExit, match="rows of 2 devices"):
        main(["plot", "--csv", str(a), str(b), "--out", str(tmp_path / "img")])


def test_without_matplotlib_exit_2_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    csv_path = tables.write_csv(decode_rows(), tmp_path / "run.csv")
    assert main(["plot", "--csv", str(csv_path), "--out", str(tmp_path / "img")]) == 2
    assert "pip install selgate[plots]" in capsys.readouterr().err
    assert not (tmp_path / "img").exists()


def test_prefill_scaling_preset_is_the_acceptance_prefill_over_T():
    (m,) = PRESETS["prefill_scaling"]()
    assert [p.S for p in m.problems] == [4096, 8192, 16384, 32768, 65536] == list(PREFILL_SCALING_T)
    ref = acceptance_prefill("bfloat16")
    for p in m.problems:
        assert dataclasses.replace(p, S=ref.S, S_kv=ref.S_kv) == ref  # only T differs
    assert m.problems[-1].key == ref.key
    assert m.methods[:2] == ("triton", "fla_nsa") and {"sdpa", "dense_causal"} <= set(m.methods)
    assert (m.measure.warmup, m.measure.iters) == (2, 10)


def assert_title_inside(fig) -> None:
    """Drawn, the figure's title lies within its edges."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    box, width = fig._suptitle.get_window_extent(canvas.get_renderer()), fig.bbox.width
    assert 0 <= box.x0 and box.x1 <= width, (box, width, fig.get_suptitle())


def test_a_one_panel_decode_title_stays_inside_the_figure(mpl, tmp_path):
    """One range layout, a user's kernel: the configuration line (`... dotted: CUDA-graph replay
    (decode time)`) was cut at both edges of the 7.5-inch figure."""
    from selgate.bench import plots

    rows = [r for r in decode_rows() if r["dist"] == "few"]
    rows += [{**r, "method": "mysel:selection"} for r in rows if r["method"] == "triton"]
    loaded = plots.load([tables.write_csv(rows, tmp_path / "run.csv")])
    with plots._style():
        figs = plots.decode_figures(loaded)
    for fig, _ in figs.values():
        assert_title_inside(fig)


def test_a_users_kernel_is_drawn_titles_wrap_and_a_narrow_axis_has_labels(mpl, tmp_path):
    """A benchmarked kernel of the user's (`mysel:selection`) was left out of the figure, a long
    software stamp ran past its edge, and a prefill range within one decade had no y labels."""
    from selgate.bench import plots

    rows = [{**r, "software": SOFTWARE + " " + "x" * 150} for r in prefill_rows([4096, 8192])]
    rows = [{**r, "ms": 2.5 + r["S"] / 16384} for r in rows if r["method"] == "triton"]
    rows += [row(acceptance_prefill("bfloat16", T), "mysel:selection", 3.0 + T / 16384) for T in (4096, 8192)]
    # 2.75 .. 3.5 ms: no power of ten, nor 2 or 5 times one, within the drawn range
    loaded = plots.load([tables.write_csv(rows, tmp_path / "run.csv")])
    with plots._style():
        fig, _ = plots.prefill_figure(loaded)
    ax = fig.axes[0]
    assert "mysel:selection" in ax.get_legend_handles_labels()[1]
    assert len(fig.get_suptitle().split("\n")) > 3
    assert_title_inside(fig)
    low, high = ax.get_ylim()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text() and low <= t.get_position()[1] <= high]
    assert labels, "no y tick label within the drawn range"


def heads_rows() -> list[dict]:
    """The prefill_heads preset's problems: the row-outer forward flat in h, the KV-outer one
    growing with it, fla-core at h = 16 only; rates as the sweep derives them."""
    (m,) = PRESETS["prefill_heads"]()
    rows = []
    for p in m.problems:
        flops = 2 * p.S * p.G * 1024 * p.h * (p.D + p.Dv)  # 16 blocks of 64 keys a row
        for method, ms in (("triton", 15.0 * p.S / 65536), ("triton_kv_outer", 0.45 * p.h * p.S / 65536 + 6.8 * p.S / 65536)):
            rows.append(row(p, method, ms, tflops=flops / ms / 1e9))
        if p.h == 16:
            rows.append(row(p, "fla_nsa", 20.6 * p.S / 65536, tflops=flops / (20.6 * p.S / 65536) / 1e9))
        else:
            rows.append(row(p, "fla_nsa", 0.0, status="skip", note="needs h >= 16"))
    return rows


def test_the_prefill_floor_is_the_math_or_the_unique_bytes_whichever_is_more():
    """64k, 4 KV heads, D = Dv = 128, bf16, 1024 keys a row, at 800 TFLOP/s and 3000 GB/s: the
    math is 2 x 65536 x 4 x 1024 x h x 256 flops (0.17 ms at h = 1, 2.75 ms at h = 16); the unique
    bytes are K and V once (134 MB) and q and o (134 MB x h): 0.09 ms at h = 1, 0.76 ms at h = 16."""
    from selgate.bench.plots import prefill_floor_ms

    by_h = {r["h"]: r for r in heads_rows() if r["S"] == 65536 and r["method"] == "triton"}
    assert prefill_floor_ms(by_h[1]) == pytest.approx(2 * 65536 * 4 * 1024 * 256 / 800e12 * 1e3)
    assert prefill_floor_ms(by_h[16]) == pytest.approx(16 * prefill_floor_ms(by_h[1]))
    bytes_only = {**by_h[1], "matmul_tflops": 1e9}
    assert prefill_floor_ms(bytes_only) == pytest.approx((65536 * 4 * 256 * 2 * 2) / 3000e9 * 1e3)
    assert prefill_floor_ms({**by_h[1], "tflops": None}) is None


def test_the_heads_plot_has_a_panel_per_T_with_every_method_and_the_floor(tmp_path, mpl):
    from selgate.bench.plots import FLOOR_LABEL, PREFILL_HEADS_MS, prefill_heads_figure

    rows = heads_rows()
    fig, what = prefill_heads_figure(rows)
    assert [ax.get_title() for ax in fig.axes] == ["T = 8k", "T = 16k", "T = 64k"]
    labels = {line.get_label() for ax in fig.axes for line in ax.get_lines()}
    assert {"triton", "triton_kv_outer", "fla_nsa (fla-core parallel_nsa)", FLOOR_LABEL} <= labels, labels
    assert "h 1/2/4/8/16" in what
    csv_path = tmp_path / "heads.csv"
    tables.write_csv(rows, csv_path)
    assert main(["plot", "--csv", str(csv_path), "--out", str(tmp_path)]) == 0
    assert (tmp_path / PREFILL_HEADS_MS).read_bytes().startswith(PNG)


def test_the_heads_plot_is_skipped_without_two_h_at_one_T(mpl):
    from selgate.bench.plots import prefill_heads_figure

    fig, why = prefill_heads_figure(prefill_rows((4096, 8192)))
    assert fig is None and "--sweep prefill_heads" in why


def test_prefill_heads_preset_is_the_acceptance_prefill_over_h_and_T():
    """Only the query heads per KV head and T vary; fla-core runs where it applies (h = 16)."""
    (m,) = PRESETS["prefill_heads"]()
    ref = acceptance_prefill("bfloat16")
    assert sorted({(p.S, p.h) for p in m.problems}) == [(T, h) for T in (8192, 16384, 65536) for h in (1, 2, 4, 8, 16)]
    for p in m.problems:
        assert p.G == ref.G and dataclasses.replace(p, S=ref.S, S_kv=ref.S_kv, h=ref.h) == ref
    assert m.methods == ("triton", "triton_pairs", "triton_kv_outer", "fla_nsa")
    fla = get_method("fla_nsa")
    assert [p.h for p in m.problems if "h=" not in (fla.skip_reason(p, torch.device("cuda")) or "")] == [16] * 3
