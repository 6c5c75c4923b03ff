"""`bin/gate` itself: a bad argument exits 2 before any lane runs, and a verdict is printed only
for results this invocation's lane run wrote, never for an earlier run's.

Each case runs the real `bin/gate` in a copy of the checkout's layout whose `bin/setup` does
nothing and whose `.venv/bin/python` runs selgate's own lane and gate entry points, with the
lane's pytest run replaced by a scripted one (FAKE_LANE: `pass` writes passing results, `cut`
writes them and exits 2 as an interrupted pytest does, `killed` writes nothing, as a SIGKILL
leaves it) and the results under the copy's `reports/out/`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reports.test_reports_gate import passing_cases, write_lane

ROOT = Path(__file__).resolve().parents[2]

SHIM = '''
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
module, args = sys.argv[2], sys.argv[3:]
if module == "selgate.lanes" and args[:1] == ["detect"]:
    print("cpu")
    sys.exit(0)
sys.path.insert(0, {root!r})

from selgate.lanes import __main__ as lanes_main
from selgate.lanes import runner
from selgate.reports import __main__ as reports_main
from tests.reports.test_reports_gate import TREE, passing_cases, write_lane, write_policy

OUT = HERE / "reports" / "out"


def log(line):
    with open(HERE / "calls.log", "a") as f:
        f.write(line + "\\n")


def fake_run_plan(plan, *, docker=False):
    """As run_plan: the lane's folder is cleared first, then "pytest" runs."""
    log("lane " + plan.out_name)
    out = runner.clear_out(plan.out_name)
    mode = __import__("os").environ.get("FAKE_LANE", "pass")
    if mode in ("pass", "cut"):
        stage = HERE / "stage"
        shutil.rmtree(stage, ignore_errors=True)
        write_lane(stage, plan.out_name, passing_cases())
        shutil.copytree(stage / plan.out_name, out, dirs_exist_ok=True)
    return {{"pass": 0, "cut": 2, "killed": -9}}[mode]


if module == "selgate.lanes":
    runner.OUT_ROOT = OUT
    lanes_main.run_plan = fake_run_plan
    sys.exit(lanes_main.main(args))
if module == "selgate.reports":
    log("gate")
    reports_main.OUT = OUT
    reports_main.POLICY_FILE = write_policy(HERE)
    reports_main.tree_stamp = lambda root: dict(TREE)
    sys.exit(reports_main.main(args))
sys.exit(f"shim: unexpected {{sys.argv}}")
'''


@pytest.fixture
def checkout(tmp_path):
    """tmp_path laid out as a checkout: the real bin/gate, a no-op bin/setup, a .venv python."""
    (tmp_path / "bin").mkdir()
    shutil.copy(ROOT / "bin" / "gate", tmp_path / "bin" / "gate")
    (tmp_path / "bin" / "setup").write_text("#!/usr/bin/env bash\nexit 0\n")
    (tmp_path / "shim.py").write_text(SHIM.format(root=str(ROOT)))
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/usr/bin/env bash\nexec {sys.executable} "{tmp_path / "shim.py"}" "$@"\n')
    python.chmod(0o755)
    (tmp_path / "reports" / "out").mkdir(parents=True)
    return tmp_path


def earlier_pass(checkout) -> Path:
    """An earlier run's passing results and report, as a passing `bin/gate` leaves them."""
    out = checkout / "reports" / "out"
    write_lane(out, "cpu", passing_cases())
    (out / "report.md").write_text("# Gate: PASSED\n")
    return out / "cpu"


def gate(checkout, *args, lane="pass"):
    """(exit status, stdout, stderr, the calls made: `lane cpu` for a lane run, `gate`)."""
    calls = checkout / "calls.log"
    calls.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SELGATE_", "PYTEST_"))}
    proc = subprocess.run(
        ["bash", str(checkout / "bin" / "gate"), *args],
        env={**env, "FAKE_LANE": lane},
        capture_output=True,
        text=True,
        timeout=300,
    )
    made = calls.read_text().splitlines() if calls.exists() else []
    return proc.returncode, proc.stdout, proc.stderr, made


def test_a_passing_run_passes(checkout):
    rc, out, err, calls = gate(checkout)
    assert (rc, calls) == (0, ["lane cpu", "gate"]), (out, err)
    assert "GATE PASSED: required lanes cpu" in out


@pytest.mark.parametrize(
    "args, error",
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--workers", "x"], "argument --workers: expected >= 1 (a crashing test needs a worker to die in) and at most 1024"),
        (["--workers", "0"], "--workers: expected >= 1"),
        (["--workers", "99999999999999999999"], "at most 1024 (each is a process), got 99999999999999999999"),
        (["--emulate"], "--emulate needs a GPU lane"),
    ],
)
def test_a_bad_argument_exits_2_before_any_lane_runs_whatever_ran_before(checkout, args, error):
    """After a passing gate its results are still there; a bad argument neither runs the lane
    nor gates them."""
    earlier = earlier_pass(checkout)
    rc, out, err, calls = gate(checkout, *args)
    assert (rc, calls) == (2, []), (out, err)
    assert error in err
    assert "GATE" not in out + err
    assert (earlier / "junit.xml").exists(), "nothing ran, nothing was cleared"


def test_a_bad_argument_after_a_refused_run_names_itself_not_the_earlier_error(checkout):
    gate(checkout, "--workers", "0")
    rc, out, err, calls = gate(checkout, "--bogus")
    assert (rc, calls) == (2, []), (out, err)
    assert "unrecognized arguments: --bogus" in err and "--workers" not in out + err


def test_a_lane_that_leaves_no_results_blocks_rather_than_passing_on_the_last_ones(checkout):
    """A lane killed before it wrote anything, with reports/out/cpu a link to an earlier run's
    passing results: the link goes, not its target's files, and the gate blocks on the
    missing lane."""
    kept = checkout / "kept"
    shutil.move(earlier_pass(checkout), kept)
    (checkout / "reports" / "out" / "cpu").symlink_to(kept, target_is_directory=True)
    rc, out, err, calls = gate(checkout, lane="killed")
    assert (rc, calls) == (1, ["lane cpu", "gate"]), (out, err)
    assert "GATE BLOCKED: required lane cpu missing" in out
    assert (kept / "junit.xml").exists(), "the link's target is left alone"


def test_an_interrupted_lane_is_still_gated(checkout):
    """pytest's exit 2 (interrupted: a cut run) is not a bad argument: the gate reads what the
    run wrote."""
    rc, out, err, calls = gate(checkout, lane="cut")
    assert calls == ["lane cpu", "gate"] and "GATE PASSED" in out, (out, err)


# --- clearing a lane's folder -------------------------------------------------------------


def test_clearing_removes_a_link_and_leaves_its_target_alone(tmp_path):
    from selgate.lanes.runner import clear_out

    earlier = write_lane_elsewhere(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "cpu").symlink_to(earlier, target_is_directory=True)
    out = clear_out("cpu", tmp_path / "out")
    assert not out.is_symlink() and out.is_dir() and list(out.iterdir()) == []
    assert (earlier / "junit.xml").exists()


def test_clearing_a_file_or_a_dangling_link_in_the_folders_place(tmp_path):
    from selgate.lanes.runner import clear_out

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "cpu").write_text("not a folder")
    (tmp_path / "out" / "sm90").symlink_to(tmp_path / "gone")
    for lane in ("cpu", "sm90"):
        out = clear_out(lane, tmp_path / "out")
        assert not out.is_symlink() and out.is_dir() and list(out.iterdir()) == []


def test_a_folder_that_cannot_be_cleared_is_an_error_naming_it(tmp_path, monkeypatch, capsys):
    """shutil.rmtree failing (a file it may not remove): the run stops naming the folder, and
    the earlier results are not presented as cleared."""
    from selgate.lanes import __main__ as lanes_main
    from selgate.lanes import runner

    def rmtree(path, ignore_errors=False, onerror=None, **kw):
        if not ignore_errors:
            raise PermissionError(13, "Permission denied", str(path / "junit.xml"))

    earlier = write_lane_elsewhere(tmp_path)
    monkeypatch.setattr(runner.shutil, "rmtree", rmtree)
    with pytest.raises(PermissionError, match=rf"^{earlier}: cannot empty the lane's results folder .*Permission denied"):
        runner.clear_out("cpu", earlier.parent)
    monkeypatch.setattr(runner, "OUT_ROOT", earlier.parent)
    monkeypatch.setattr(lanes_main, "run_plan", lambda plan, docker=False: pytest.fail("the lane ran"))
    assert lanes_main.main(["run", "cpu"]) == 1
    assert f"error: {earlier}: cannot empty" in capsys.readouterr().err


def write_lane_elsewhere(tmp_path) -> Path:
    """An earlier run's passing results in tmp_path/earlier/cpu."""
    write_lane(tmp_path / "earlier", "cpu", passing_cases())
    return tmp_path / "earlier" / "cpu"


def test_checking_a_runs_arguments_touches_nothing(tmp_path, monkeypatch, capsys):
    from selgate.lanes import __main__ as lanes_main
    from selgate.lanes import runner

    earlier = write_lane_elsewhere(tmp_path)
    monkeypatch.setattr(runner, "OUT_ROOT", earlier.parent)
    monkeypatch.setattr(lanes_main, "run_plan", lambda plan, docker=False: pytest.fail("the lane ran"))
    before = sorted(p.name for p in earlier.iterdir())
    assert lanes_main.main(["run", "cpu", "--check", "--workers", "1"]) == 0
    assert lanes_main.main(["run", "cpu", "--check", "--workers", "0"]) == 2
    assert "--workers: expected >= 1" in capsys.readouterr().err
    assert sorted(p.name for p in earlier.iterdir()) == before


def test_on_github_actions_each_blocking_line_is_an_error_annotation(monkeypatch, capsys):
    from selgate.reports.__main__ import annotate

    annotate(["lane cpu: FAIL x: 100% off\nsecond line"])
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    annotate(["lane cpu: FAIL x: 100% off\nsecond line"])
    assert capsys.readouterr().out == "::error title=selgate gate blocked::lane cpu: FAIL x: 100%25 off%0Asecond line\n"
