"""The command lines as a user meets them: every command's help is its own, says what each option
does and its default; a bad value is a usage error (exit 2) naming the option, before anything
runs; an output folder that cannot be written is said, not a traceback."""

from __future__ import annotations

import argparse
import errno
import subprocess
import sys

import pytest

from selgate.cli_args import HelpFormatter


def _parsers():
    """(name, parser) of every selgate command and subcommand that parses with argparse."""
    from selgate.bench.__main__ import parser as bench
    from selgate.lanes.__main__ import parser as lanes
    from selgate.reports.__main__ import parser as reports
    from selgate.reports.check_cli import parser as check

    todo = [("selgate check", check()), ("selgate bench", bench()), ("selgate lanes", lanes()), ("selgate reports", reports())]
    while todo:
        name, p = todo.pop()
        yield name, p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {sub}", q) for sub, q in action.choices.items() if q.add_help]


def test_every_option_says_what_it_does_and_its_default():
    missing = []
    for name, p in _parsers():
        assert issubclass(p.formatter_class, HelpFormatter), name
        assert p.description, f"{name} --help has no description of its own"
        fmt = p.formatter_class(p.prog)
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: no help")
            elif action.default not in (None, False) and "default" not in fmt._get_help_string(action):
                missing.append(f"{name} {action.option_strings}: default not shown")
    assert not missing, missing


def test_help_shows_a_default_once():
    p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    p.add_argument("--iters", type=int, default=50, help="timed calls")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls (default 10)")
    p.add_argument("--D", default=[64, 128], help="head dims")
    p.add_argument("--graph", action="store_true", help="also graphs")
    text = p.format_help()
    assert "timed calls (default 50)" in text and "(default 10)" in text and text.count("default 10") == 1
    assert "head dims (default 64,128)" in text and "also graphs\n" in text


@pytest.mark.parametrize(
    "argv, option",
    [
        (["sel", "--budget-s", "-5"], "--budget-s"),
        (["sel", "--budget_s", "nan"], "--budget-s"),
        (["sel", "--iters", "0"], "--iters"),
        (["sel", "--iters", "1" + "0" * 400], "--iters"),  # compared as a float it overflowed: a traceback
        (["sel", "--warmup", "1" + "0" * 30], "--warmup"),
        (["sel", "--budget-s", "1e400"], "--budget-s"),
        (["sel", "--warmup", "-1"], "--warmup"),
        (["sel", "--max-seconds", "inf"], "--max-seconds"),
        (["sel", "--N", "0"], "--N"),
        (["sel", "--device", "nonsense"], "--device"),
        (["tune", "--budget-s", "-1"], "--budget-s"),
        (["thresholds", "no-such.csv"], "csv"),
        (["host", "--calls", "0"], "--calls"),
    ],
)
def test_a_bad_bench_value_is_a_usage_error_naming_it(argv, option, capsys, tmp_path, monkeypatch):
    from selgate.bench.__main__ import main

    monkeypatch.chdir(tmp_path)  # a value taken by mistake runs the bench, whose tables go under the current folder

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {option}" in err, err


@pytest.mark.parametrize(
    "argv, said",
    [
        (["gate", "--lanes", "nonsense"], "--lanes: nonsense: neither a lane"),
        (["release", "--lanes", "cpu,nonsense"], "--lanes: nonsense"),
        (["gate", "--results", "/no/such/folder"], "--results: /no/such/folder is not a folder"),
    ],
)
def test_a_bad_reports_argument_is_a_usage_error_naming_it(argv, said, capsys):
    from selgate.reports.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and said in capsys.readouterr().err


def test_a_lane_of_the_results_needs_no_yaml(tmp_path, capsys):
    """An ad-hoc lane (results with no lanes/<lane>.yaml) is still gated, not refused."""
    from selgate.reports.__main__ import main

    (tmp_path / "adhoc").mkdir()
    assert main(["gate", "--lanes", "adhoc", "--results", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    assert "required lane adhoc" in capsys.readouterr().out


def test_an_unwritable_report_folder_is_an_error_naming_it(tmp_path, capsys):
    from selgate.reports.__main__ import main

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["gate", "--results", str(tmp_path), "--out", str(blocker / "out")]) == 2
    assert f"error: --out {blocker / 'out'}: cannot write the report there" in capsys.readouterr().err


def test_a_read_only_check_folder_is_a_usage_error(tmp_path, monkeypatch):
    """On a read-only mount even removing a missing file fails (EROFS): the check says --out."""
    from pathlib import Path

    from selgate.lanes import check_run

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(Path, "unlink", refuse)
    monkeypatch.setattr(check_run.os, "open", refuse)
    with pytest.raises(check_run.UsageError, match="--out .*: cannot write a report there \\(Read-only file system\\)"):
        check_run.writable(tmp_path)


def test_pytest_markers_lists_the_families_in_any_project(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--markers", "-p", "selgate.conformance.plugin", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "@pytest.mark.parity: conformance family" in proc.stdout and "@pytest.mark.conformance:" in proc.stdout
