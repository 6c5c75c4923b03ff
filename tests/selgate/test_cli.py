"""The `selgate` command as a newcomer meets it: help that lists the tools and exits 0, usage
errors that exit 2 and write nothing, `selgate check --help` without importing torch, and
the checkout-only tools refused (with what to do) where selgate is installed from a wheel."""

import subprocess
import sys

import pytest

from selgate import cli

SELGATE = [sys.executable, "-m", "selgate"]


def _run(*args, cwd=None):
    proc = subprocess.run([*SELGATE, *args], capture_output=True, text=True, cwd=cwd, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_help_lists_the_tools_and_exits_0():
    rc, out, _ = _run("--help")
    assert rc == 0
    assert all(f"  {tool} " in out for tool in cli.TOOLS), out


@pytest.mark.parametrize("args", [(), ("nosuchtool",)])
def test_no_or_an_unknown_tool_is_a_usage_error(args):
    rc, _, err = _run(*args)
    assert rc == 2 and "usage: selgate <tool>" in err


def test_check_help_imports_no_torch():
    code = (
        "import sys\nfrom selgate.reports import check_cli\n"
        "try:\n    check_cli.main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: selgate check" in proc.stdout and "--declare" in proc.stdout


def test_a_check_usage_error_exits_2_and_writes_nothing(tmp_path):
    rc, _, err = _run("check", "mykern", cwd=tmp_path)
    assert rc == 2 and "impl: expected package.module:callable" in err, err
    assert list(tmp_path.iterdir()) == []


def test_from_a_wheel_the_checkout_tools_are_refused_with_what_to_do(monkeypatch, capsys):
    monkeypatch.setattr(cli, "checkout", lambda: None)
    with pytest.raises(SystemExit) as e:
        cli.main(["lanes", "run", "cpu"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "installed from a wheel" in err and "selgate check pkg.mod:fn" in err
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "  check " in out and "  lanes " not in out and "from a checkout" in out


def test_in_this_checkout_every_tool_is_offered():
    assert cli.checkout() is not None
    assert "  lanes " in cli.usage() and "  reports " in cli.usage()


def test_python_m_selgate_imports_nothing_from_the_callers_folder(tmp_path):
    """`python -m` puts the current folder first on the import path of the process that decides
    `selgate check`'s verdict, where a module beside the kernel (a `junitparser.py` that made
    every verdict PASSED) loaded in place of the real one: selgate's tools run without it."""
    (tmp_path / "argparse.py").write_text("raise SystemExit(99)\n")
    rc, out, err = _run("check", "--help", cwd=tmp_path)
    assert rc == 0 and "usage: selgate check" in out, (rc, err)


@pytest.mark.parametrize(
    "argv, module",
    [
        (["python", "-m", "selgate", "check"], "selgate"),
        (["python", "-X", "importtime", "-W", "error", "-m", "selgate.reports.check"], "selgate.reports.check"),
        (["python", "/venv/bin/pytest", "-m", "selgate_marker"], ""),  # a script's own -m
        (["python", "-c", "import selgate", "-m", "selgate"], ""),
        (["python"], ""),
    ],
)
def test_only_the_interpreters_own_m_counts_as_a_module_run(argv, module):
    import selgate

    assert selgate._module_run(argv) == module
