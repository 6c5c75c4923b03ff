"""`bench sel --backends pkg.mod:fn`: outside kernels timed beside ours through the
conformance loader, declarations and block-index adapters, on tiny CPU shapes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from selgate.bench import outside, tables
from selgate.bench.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tests.outside.tokenkernels:gather"
FLA = "tests.outside.blockkernels:fla_style"
DECODE = ["sel", "--N", "3", "--H", "2", "--D", "16", "--Dv", "8", "--L_list", "16,24", "--iters", "2", "--warmup", "1"]
PREFILL = [
    "sel",
    "--T",
    "40",
    "--heads",
    "4",
    "--groups",
    "2",
    "--D",
    "16",
    "--l_sel",
    "8",
    "--n_blocks",
    "3",
    "--iters",
    "2",
    "--warmup",
    "1",
]


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    """The outside kernels live in tests/outside/, importable from the repository root; each
    test loads its kernels afresh."""
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setattr(outside, "_LOADED", {})
    for name in [m for m in sys.modules if m.startswith("tests.outside")]:
        monkeypatch.delitem(sys.modules, name)


def run(tmp_path, *args):
    assert main([*args, "--out", str(tmp_path)]) == 0
    return {(r["config"], r["method"]): r for r in tables.read_csv(tmp_path / "sel.csv")}


def test_outside_token_kernel_rows_beside_ours(tmp_path):
    rows = run(tmp_path, *DECODE, "--dtype", "fp32", "--backends", f"sdpa,{TOKEN}")
    assert sorted(m for _, m in rows) == sorted(["sdpa", TOKEN] * 2)
    for (config, method), r in rows.items():
        assert r["status"] == "ok" and r["ms"] > 0
        assert r["ours"] == (method == "sdpa")
        if method == TOKEN:
            assert "sdpa" in tables.parse_speedups(r["speedups"])


def test_rows_the_declarations_exclude_are_skips_with_the_reason(tmp_path):
    rows = run(tmp_path, *DECODE, "--dtype", "bf16", "--backends", f"sdpa,{TOKEN}")
    outs = [r for (_, m), r in rows.items() if m == TOKEN]
    assert len(outs) == 2 and {r["status"] for r in outs} == {"skip"}
    assert all("does not declare torch.bfloat16" in r["note"] for r in outs)
    assert {r["status"] for (_, m), r in rows.items() if m == "sdpa"} == {"ok"}


def test_declare_file_overrides_the_callable(tmp_path):
    declare = tmp_path / "decl.yaml"
    declare.write_text("dtypes: [fp32]\nmin_heads: 4\n")
    rows = run(tmp_path, *DECODE, "--dtype", "fp32", "--backends", f"sdpa,{TOKEN}", "--declare", str(declare))
    outs = [r for (_, m), r in rows.items() if m == TOKEN]
    assert {r["status"] for r in outs} == {"skip"} and all(">= 4; case has 2" in r["note"] for r in outs)


def test_block_index_kernel_gets_whole_blocks(tmp_path):
    rows = run(tmp_path, *PREFILL, "--dtype", "fp32", "--backends", f"sdpa,{FLA}")
    fla, sdpa = rows[next(k for k in rows if k[1] == FLA)], rows[next(k for k in rows if k[1] == "sdpa")]
    assert fla["status"] == "ok" and fla["ms"] > 0 and "whole blocks of 8 keys" in fla["note"]
    assert sdpa["status"] == "ok" and "whole blocks" not in sdpa["note"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--backends", "sdpa,tests.outside.nope:fn"], "No module named"),
        (["--backends", "sdpa", "--declare", "x.yaml"], "declares one package.module:callable"),
        # a path for a module failed in importlib: "the 'package' argument is required to perform a relative import"
        (["--backends", "sdpa,../x/mysel:selection"], "--backends: '../x/mysel' is not a module name"),
    ],
)
def test_bad_outside_backends_are_usage_errors(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        main([*DECODE, *args])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_kernel_beside_the_caller_loads_without_the_folder_on_the_path(tmp_path):
    """As the `selgate` console script runs (no current folder on sys.path: PYTHONSAFEPATH),
    `--backends mysel:fn` imports mysel.py from the current folder, as `selgate check` does."""
    import os
    import subprocess

    (tmp_path / "mysel.py").write_text((ROOT / "tests" / "outside" / "tokenkernels.py").read_text())
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    code = "import sys; from selgate.cli import main; sys.exit(main())"
    args = [*DECODE, "--dtype", "fp32", "--backends", "sdpa,mysel:gather", "--out", "res"]
    out = subprocess.run([sys.executable, "-c", code, "bench", *args], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert {r["method"] for r in tables.read_csv(tmp_path / "res" / "sel.csv")} == {"sdpa", "mysel:gather"}


def test_from_a_wheel_the_tables_go_to_the_current_folder(tmp_path, monkeypatch):
    """An installed package's bench/results is inside site-packages: never written there."""
    packaged = tmp_path / "site-packages" / "selgate" / "bench"
    monkeypatch.setattr(tables, "__file__", str(packaged / "tables.py"))
    monkeypatch.setattr(tables, "RESULTS_DIR", packaged / "results")
    monkeypatch.chdir(tmp_path)
    assert tables.results_dir("NVIDIA H200", "2026-12-06") == tmp_path / "bench-results" / "nvidia-h200" / "2026-12-06"


def test_from_another_folder_the_tables_go_there_not_into_the_checkout(tmp_path, monkeypatch):
    """An editable install run from a user's folder wrote into the checkout it points at, and the
    table then changed the tree a release gates; in the checkout's root they go beside the baselines."""
    monkeypatch.chdir(tmp_path)
    assert tables.results_dir("NVIDIA H200", "2026-12-06") == tmp_path / "bench-results" / "nvidia-h200" / "2026-12-06"
    monkeypatch.chdir(ROOT)
    assert tables.results_dir("NVIDIA H200", "2026-12-06") == ROOT / "bench" / "results" / "nvidia-h200" / "2026-12-06"


@pytest.mark.parametrize("command", [DECODE, ["plot", "--csv", str(ROOT / "tests" / "data" / "bench" / "latest_cpu.csv")]])
def test_an_out_that_takes_no_file_is_a_usage_error_before_anything_runs(command, tmp_path, monkeypatch, capsys):
    """A file, or a read-only folder, as --out: a traceback after the whole timing before."""
    import errno

    from selgate.bench import __main__ as bench

    monkeypatch.setattr(bench, "measure_limits", lambda *a, **k: pytest.fail("timed before --out was checked"))
    (tmp_path / "afile").write_text("")
    with pytest.raises(SystemExit) as e:
        main([*command, "--out", str(tmp_path / "afile")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--out {tmp_path / 'afile'}: cannot write its files there (not a folder)" in err

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("os.open", refuse)
    with pytest.raises(SystemExit) as e:
        main([*command, "--out", str(tmp_path / "ro")])
    assert e.value.code == 2 and "cannot write its files there (Read-only file system)" in capsys.readouterr().err
