"""`python -m selgate.bench sel` on tiny CPU shapes: tables, metrics, robustness, arguments."""

from __future__ import annotations

import os
import re

import pytest
import torch

from selgate.bench import baselines, tables
from selgate.bench.__main__ import main
from selgate.bench.presets import PRESETS, acceptance_checks
from selgate.kernels.config import current_device_name, device_slug

TINY = ["sel", "--N", "3", "--H", "2", "--D", "16", "--Dv", "8", "--L_list", "16,24", "--iters", "3", "--warmup", "1"]


def run(tmp_path, capsys, *args):
    assert main([*TINY, "--out", str(tmp_path), *args]) == 0
    out = capsys.readouterr().out
    return tables.read_csv(tmp_path / "sel.csv"), out


def test_decode_smoke_tables_and_metrics(tmp_path, capsys):
    rows, out = run(
        tmp_path, capsys, "--dtype", "fp32", "--dist", "few,mixed", "--backends", "sdpa,masked_sdpa,gather_sdpa,reference"
    )
    assert len(rows) == 4 * 4 and {r["status"] for r in rows} == {"ok"}
    assert out.rstrip().splitlines()[-1].startswith("files: ") and "## selgate bench summary" in out
    assert rows[0]["software"].startswith(f"torch {torch.__version__}")
    md = (tmp_path / "sel.md").read_text()
    assert md.count("\n| decode N=3") == 16 and "95% interval" in md
    for r in rows:
        assert r["ms_lo"] <= r["ms"] <= r["ms_hi"] and r["iters"] == 3
        if r["dist"] == "few":  # every one of the 3 rows selects L keys of K (D=16) and V (Dv=8), fp32
            assert r["kv_bytes"] == 3 * r["L"] * (16 + 8) * 4
        assert r["io_bytes"] == r["kv_bytes"] + 3 * 2 * (16 + 8) * 4
        assert r["gbps"] == pytest.approx(r["io_bytes"] / r["ms"] / 1e6, rel=1e-4)
        assert r["frac_copy"] == pytest.approx(r["gbps"] / r["copy_gbps"], rel=1e-2)
    by = {(r["config"], r["method"]): r for r in rows}
    for (config, method), r in by.items():
        for other, x in tables.parse_speedups(r["speedups"]).items():
            assert x == pytest.approx(by[(config, other)]["ms"] / r["ms"], rel=2e-3)


def test_prefill_smoke_skips_what_does_not_apply(tmp_path, capsys):
    rows, _ = run(
        tmp_path,
        capsys,
        "--T",
        "64",
        "--heads",
        "4",
        "--groups",
        "2",
        "--l_sel",
        "8",
        "--n_blocks",
        "3",
        "--backends",
        "sdpa,gather_sdpa,dense_causal,fla_nsa,cuda",
    )
    got = {r["method"]: r for r in rows}
    assert got["sdpa"]["status"] == "ok" and got["sdpa"]["dtype"] == "bfloat16"
    assert got["gather_sdpa"]["status"] == "ok" and got["dense_causal"]["status"] == "ok"
    assert got["cuda"]["status"] == "skip" and got["cuda"]["note"] == "decode only"
    assert got["fla_nsa"]["status"] == "skip" and got["fla_nsa"]["note"]  # needs CUDA, fla and 16 heads/group


def test_a_failing_backend_is_logged_and_the_sweep_goes_on(tmp_path, capsys, monkeypatch):
    def broken(p, x):
        def call():
            raise RuntimeError("kernel exploded\nsecond line")

        return call

    monkeypatch.setitem(baselines.METHODS, "broken", baselines.Method("broken", True, broken))
    rows, out = run(tmp_path, capsys, "--dtype", "fp32", "--backends", "broken,sdpa")
    assert [r["status"] for r in rows] == ["error", "ok"] * 2
    assert rows[0]["note"] == "RuntimeError: kernel exploded"
    assert "errors (first 5):" in out and "kernel exploded" in (tmp_path / "sel.md").read_text()


def test_time_budget_skips_the_rest_and_default_output_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tables, "RESULTS_DIR", tmp_path)
    assert main([*TINY, "--budget_s", "0.001", "--backends", "sdpa"]) == 0
    device = current_device_name()
    rows = tables.read_csv(tables.latest_csv(device))
    assert tables.latest_csv(device).parent.parent == tmp_path / device_slug(device)
    assert [r["status"] for r in rows] == ["skip", "skip"] and "time budget" in rows[0]["note"]


def test_the_budget_is_checked_before_each_method_not_only_each_problem(tmp_path, capsys, monkeypatch):
    """Each timing takes 100 s of a fake clock; a budget of 150 s times two methods of the first
    problem and skips the rest (it once ran every method of a problem begun before the deadline)."""
    from selgate.bench import sweep

    clock = [0.0]
    measure = sweep._measure

    def slow_measure(*args, **kwargs):
        fields = measure(*args, **kwargs)
        clock[0] += 100.0
        return fields

    monkeypatch.setattr(sweep, "_measure", slow_measure)
    monkeypatch.setattr(sweep.time, "monotonic", lambda: clock[0])
    rows, _ = run(tmp_path, capsys, "--budget_s", "150", "--backends", "sdpa,masked_sdpa,gather_sdpa")
    assert [r["status"] for r in rows] == ["ok", "ok", "skip", "skip", "skip", "skip"]
    assert rows[2]["note"] == "time budget of 150 s spent"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dist", "some"], "expected a comma-separated subset of"),
        (["--backends", "sdpa,nope"], "backend: expected one of"),
        (["--N", "1x"], "expected comma-separated integers"),
    ],
)
def test_bad_arguments_are_named(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        main([*TINY, *args])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_decode_and_prefill_flags_exclude_each_other():
    with pytest.raises(SystemExit, match="--decode and --T"):
        main([*TINY, "--decode", "--T", "64"])


def test_presets_hold_the_acceptance_and_seed_matrices():
    seed = [p for m in PRESETS["seed"]() for p in m.problems]
    assert len(seed) == 2 * 2 * 2 * 7 * 3 * 3 and {p.B for p in seed} == {64, 256, 1024}
    assert {p.L for p in seed} == {16, 32, 64, 128, 256, 512, 1024} and {p.dtype for p in seed} == {"bfloat16"}
    decode, prefill = (m.problems for m in PRESETS["acceptance"]())
    assert {(p.B, p.h, p.D, p.Dv, p.L) for p in decode} == {(1024, 8, 128, 128, 512), (1024, 8, 128, 128, 1024)}
    pf, pf_key = prefill
    assert (pf.B, pf.S, pf.G, pf.h, pf.D, pf.Dv, pf.l_sel, pf.n_blocks) == (1, 65536, 4, 16, 128, 128, 64, 16)
    assert (pf.kv_layout, pf_key.kv_layout) == ("separate", "key") and pf_key.key == pf.key + " kv=key"


def test_the_perf_smoke_times_rows_of_the_full_matrix_the_same_way():
    """The release gate judges each smoke row by the `full` baseline's row of its configuration and
    method: a row outside `full`, or timed with other settings, would compare unlike with unlike."""
    full = {(p.key, m.measure) for m in PRESETS["full"]() for p in m.problems}
    smoke = [(p, m) for m in PRESETS["smoke"]() for p in m.problems]
    assert {(p.key, m.measure) for p, m in smoke} <= full
    assert {(p.kind, p.L if p.kind == "decode" else p.S) for p, _ in smoke} == {("decode", 1024), ("prefill", 65536)}
    assert all({"triton"} <= set(m.methods) for _, m in smoke)


@pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="Triton runs on CPU only under TRITON_INTERPRET=1 (bin/test sets it)",
)
def test_triton_smoke_under_the_interpreter(tmp_path, capsys):
    """fp32 only: the interpreter computes bf16 wrongly (triton-lang/triton#11584)."""
    rows, _ = run(tmp_path, capsys, "--N", "2", "--L_list", "16", "--dtype", "fp32", "--backends", "sdpa,triton,triton@16x4x2")
    got = {r["method"]: r for r in rows}
    assert got["triton"]["status"] == "ok" and got["triton"]["ms"] > 0
    assert got["triton@16x4x2"]["status"] == "ok" and got["triton@16x4x2"]["kernel_config"] == "16x4x2"


def test_acceptance_bars_are_checked_from_the_rows():
    (dec, *_), (pf, pf_key) = (m.problems for m in PRESETS["acceptance"]())
    rows = [
        {"config": dec.key, "method": "triton", "status": "ok", "ms": 0.5, "frac_copy": 0.8, "host_ms": 0.1},
        {"config": dec.key, "method": "gather_sdpa", "status": "ok", "ms": 3.0, "frac_copy": 0.1},
        {"config": pf.key, "method": "triton", "status": "ok", "ms": 20.0, "frac_copy": 0.1},
        {"config": pf_key.key, "method": "triton", "status": "ok", "ms": 14.0, "frac_copy": 0.1},
    ]
    lines = acceptance_checks(rows)
    # the per-key layout is reported beside the bar's row, never judged in its place
    assert (
        f"- INFO {pf_key.key} / triton: 14.00 ms (K and V stored per key; the bar is judged on separate K and V tensors)" in lines
        and not any(x.startswith(f"- PASS {pf_key.key}") for x in lines)
    )
    assert any(
        x.startswith(f"- PASS {dec.key} / triton: no graph timing the HBM floor (bar 1.5x; eager 0.5000 ms = 1.25x")
        and "6.0x vs gather" in x
        for x in lines
    )
    assert f"- FAIL {pf.key} / triton: 20.00 ms (bar 15 ms)" in lines
    rows[1]["ms"] = 2.0  # only 4x faster than gather-then-SDPA
    assert acceptance_checks(rows)[2].startswith("- FAIL")
    rows[1]["ms"] = 4.0
    rows[0].update(ms=0.7, frac_copy=0.8 * 0.5 / 0.7)  # eager host-bound at 1.75x the floor ...
    assert acceptance_checks(rows)[2].startswith("- FAIL")
    rows[0]["graph_ms"] = 0.55  # ... while the device time is 1.375x: the floor bar is on device time
    assert acceptance_checks(rows)[2].startswith(f"- PASS {dec.key} / triton: graph 0.5500 ms = 1.38x the HBM floor")


def test_launch_preset_sweeps_triton_variants():
    decode, prefill = PRESETS["launch"]()
    assert decode.methods[:2] == ("sdpa", "triton") and "triton@64x4x3" in decode.methods
    assert {p.L for p in decode.problems} == {16, 32, 64, 128, 256, 512, 1024}


def test_the_device_benchmarks_are_bench_subcommands(capsys):
    """`selgate bench triton-bwd` and `cuda-decode` are listed and hand their options to the
    benchmark module; on a machine without CUDA the decode benchmark says so (exit 2)."""
    from selgate.bench.__main__ import DEVICE_BENCHES

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and all(name in out for name in DEVICE_BENCHES)
    with pytest.raises(SystemExit) as e:
        main(["triton-bwd", "--help"])
    assert e.value.code == 0 and "selgate.bench triton-bwd [-h]" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert main(["cuda-decode"]) == 2 and "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["sel", "tune", "thresholds"])
def test_options_are_spelt_with_hyphens_and_the_old_underscores_still_work(command, capsys):
    """One option style across selgate's commands (`selgate check --import-timeout`): bench's
    `--budget_s` and the like are aliases of `--budget-s`, shown in help after it."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    underscored = re.findall(r"(--[A-Za-z]+_[A-Za-z_]+)", text)
    assert underscored, text
    for old in underscored:  # `--budget-s BUDGET_S, --budget_s BUDGET_S`: the hyphen first
        assert re.search(re.escape(old.replace("_", "-")) + r"( [A-Z_]+)?, " + re.escape(old), text), (old, text)


def test_a_hyphenated_option_sets_what_its_old_spelling_set(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tables, "RESULTS_DIR", tmp_path)
    assert main([*[x.replace("--L_list", "--L-list") for x in TINY], "--budget-s", "0.001", "--backends", "sdpa"]) == 0
    rows = tables.read_csv(tables.latest_csv(current_device_name()))
    assert [r["L"] for r in rows] == [16, 24] and "time budget of 0 s" in rows[0]["note"]


def test_a_slow_call_keeps_to_the_budget(tmp_path, capsys, monkeypatch):
    """Calls of 0.3 s, a budget of 1 s: the warm-up shows that ten samples would end past it, so
    the row is a skip naming the budget, and the run ends within about a call of it (a 3 s call
    under the interpreter took a 5 s budget to 63 s, checked only between methods)."""
    import time

    def slow(p, x):
        return lambda: time.sleep(0.3)

    monkeypatch.setitem(baselines.METHODS, "slow", baselines.Method("slow", True, slow))
    started = time.monotonic()
    args = ("--dtype", "fp32", "--backends", "slow", "--warmup", "2", "--iters", "10", "--budget-s", "1", "--device", "cpu")
    rows, _ = run(tmp_path, capsys, *args)  # cpu: a GPU's bandwidth probe would take part of the budget
    assert time.monotonic() - started < 2.5
    assert [r["status"] for r in rows] == ["skip", "skip"]
    assert rows[0]["note"].startswith("time budget of 1 s spent: 10 timed calls of 30") and "would end past it" in rows[0]["note"]


def test_a_run_that_measured_nothing_exits_1(tmp_path, capsys):
    """Every row an error (a batch of 2^63 - 1 overflows torch's storage size): it said exit 0."""
    assert main([*TINY, "--out", str(tmp_path), "--N", str(2**63 - 1), "--backends", "sdpa"]) == 1
    assert "nothing measured: every row failed or was skipped (the first error: " in capsys.readouterr().err
    assert {r["status"] for r in tables.read_csv(tmp_path / "sel.csv")} == {"error"}, "the table is still written"
