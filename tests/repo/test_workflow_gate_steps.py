"""The Actions gate and release jobs, run as their YAML says: each job's steps, in order, on a
fresh committed copy of this repository (the checkout), with the lanes' results placed where
the job's download step puts them. The `run:` scripts are taken from the YAML with their
`${{ }}` expressions substituted and run under bash as a runner runs them; the other steps are
played by the test (checkout: the copy; setup-python: this interpreter first on PATH;
download-artifact: the results written to its `path`; upload-artifact: nothing). The runner is
provisioned ahead: the copy's .venv is made so that `bash bin/setup` finds everything present
and installs nothing (the machine may have no package index).

Good evidence must pass and a failing test must block: a download into the checkout once made
every run block ("ran other files", and a release's "uncommitted changes")."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from unittest import mock
import tomllib
from pathlib import Path

import pytest
import yaml

from selgate.reports.gate import lane_families, load_policy

from tests.reports.test_reports_gate import write_lane

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
FAILING = ("conformance/test_conformance.py::test_parity[triton-case0]", "fail", "parity", 0)

pytestmark = pytest.mark.skipif(
    not (ROOT / ".git").exists() or shutil.which("git") is None, reason="needs a git checkout of selgate"
)

FINDER = '''"""selgate's packages mapped onto this checkout's folders, as an editable install maps them."""
import importlib.util
import os
import sys

MAPPING = {mapping!r}


class _Finder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        folder = MAPPING.get(name)
        if folder is None:
            return None
        init = os.path.join(folder, "__init__.py")
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[folder])


sys.meta_path.append(_Finder)
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=gate@example.invalid", "-c", "user.name=gate", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def provision_venv(checkout: Path) -> None:
    """checkout/.venv seeing this interpreter's packages (torch, junitparser, ...) and selgate
    mapped onto the checkout's folders: what `bash bin/setup` leaves, made without pip."""
    venv = checkout / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    import sysconfig

    here = dict.fromkeys(os.path.realpath(p) for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]))
    (site / "selgate-host-env.pth").write_text("\n".join(here) + "\n")
    dirs = tomllib.loads((checkout / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    mapping = {name: str(checkout / folder) for name, folder in dirs.items()}
    (site / "_selgate_checkout_finder.py").write_text(FINDER.format(mapping=mapping))
    (site / "_selgate_checkout_finder.pth").write_text("import _selgate_checkout_finder\n")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A fresh repository holding this working tree's files (tracked and untracked, not ignored)
    in one commit: a clean tree, as actions/checkout leaves one."""
    path = tmp_path_factory.mktemp("actions") / "checkout"
    path.mkdir()
    listed = git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() or src.is_symlink():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, path / rel, follow_symlinks=False)
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "the tree under test")
    provision_venv(path)
    return path


class Runner:
    """One job of one workflow run on `checkout`, its `runner.temp` under `temp`."""

    def __init__(self, checkout: Path, temp: Path, lanes: str, needs: list):
        self.checkout, self.temp = checkout, temp
        self.sha = git(checkout, "rev-parse", "HEAD").strip()
        self.values = {
            "runner.temp": str(temp),
            "needs.plan.outputs.lanes": lanes,
            "needs.plan.outputs.may_skip": "approve,gpu,sm89",
            "toJSON(needs)": json.dumps({job: {"result": "success", "outputs": {}} for job in needs}),
        }
        self.summary = temp / "summary.md"
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "SELGATE_", "PYTEST_", "RUNNER_", "VIRTUAL_ENV"))
        }
        self.env.pop("PYTHONPATH", None)
        self.env.update(
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # setup-python's interpreter
            CI="true",
            GITHUB_ACTIONS="true",
            GITHUB_SHA=self.sha,
            GITHUB_WORKSPACE=str(checkout),
            GITHUB_STEP_SUMMARY=str(self.summary),
            RUNNER_TEMP=str(temp),
        )

    def substitute(self, text: str) -> str:
        def value(m):
            expr = m.group(1).strip()
            assert expr in self.values, f"an expression the test does not play: {expr!r}"
            return self.values[expr]

        return re.sub(r"\$\{\{(.*?)\}\}", value, str(text))

    def run_job(self, job: dict, place_results) -> list:
        """Each step as the runner would run it: (step name, exit status, output) per `run:` step."""
        ran, failed = [], False
        for step in job["steps"]:
            cond = step.get("if", "success()")
            assert cond in ("success()", "always()"), f"a condition the test does not play: {cond!r}"
            if failed and cond != "always()":
                continue
            uses = step.get("uses", "")
            if uses.startswith("actions/download-artifact@"):
                where = Path(self.substitute(step["with"]["path"]))
                place_results(where if where.is_absolute() else self.checkout / where)
            elif "run" in step:
                script = self.temp / "step.sh"
                script.write_text(self.substitute(step["run"]))
                env = {**self.env, **{k: self.substitute(v) for k, v in (step.get("env") or {}).items()}}
                proc = subprocess.run(
                    ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                    cwd=self.checkout,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                ran.append((step.get("name", step["run"][:40]), proc.returncode, proc.stdout + proc.stderr))
                failed |= proc.returncode != 0
        return ran


def job_of(workflow: str, job: str) -> dict:
    return yaml.safe_load((WORKFLOWS / workflow).read_text())["jobs"][job]


def lane_cases(lane: str) -> list:
    """A passing test in every family the lane must pass."""
    return [(f"conformance/test_conformance.py::test_{f}[case0]", "pass", f, 7) for f in lane_families(load_policy(), lane)]


def evidence(checkout: Path, lanes: list, failing: bool):
    """The lanes' results as the download step leaves them, stamped with the checkout's tree."""
    from selgate.tree import tree_stamp

    def place(results: Path):
        # as the lane's runner has it: the checkout's commit in GITHUB_SHA, and no SELGATE_COMMIT
        # of the machine running this test (a GPU host stamping a copy without git sets one)
        env = {k: v for k, v in os.environ.items() if k != "SELGATE_COMMIT"}
        env["GITHUB_SHA"] = git(checkout, "rev-parse", "HEAD").strip()
        with mock.patch.dict(os.environ, env, clear=True):
            stamp = tree_stamp(checkout)
        for lane in lanes:
            cases = lane_cases(lane) + ([FAILING] if failing else [])
            write_lane(results, lane, cases, tree=stamp, exitstatus=1 if failing else 0)
            junit = results / lane / "junit.xml"  # the counts pytest states in its suite
            junit.write_text(
                junit.read_text().replace(
                    '<testsuite name="pytest"', f'<testsuite name="pytest" failures="{int(failing)}" errors="0"', 1
                )
            )

    return place


def step(ran: list, text: str) -> tuple:
    found = [r for r in ran if text in r[0]]
    assert len(found) == 1, [r[0] for r in ran]
    return found[0]


@pytest.mark.parametrize("failing", [False, True], ids=["good-evidence", "a-failing-test"])
def test_the_merge_gate_job_passes_good_evidence_and_blocks_a_failure(checkout, tmp_path, failing):
    job = job_of("conformance-cpu.yml", "gate")
    runner = Runner(checkout, tmp_path / "runner-temp", "cpu", job["needs"])
    runner.temp.mkdir()
    ran = runner.run_job(job, evidence(checkout, ["cpu"], failing))
    _, rc, out = step(ran, "Every lane this event needs ran and passed")
    assert rc == 0, out
    _, rc, out = step(ran, "Gate over every lane's JUnit")
    if failing:
        assert rc == 1 and f"GATE BLOCKED: lane cpu: FAIL {FAILING[0]}" in out, out
        assert "also blocking" not in out, out  # the failure alone: the tree and the stamp agree
    else:
        assert rc == 0 and "GATE PASSED: required lanes cpu" in out, out
    assert git(checkout, "status", "--porcelain") == ""  # the job leaves the checkout clean


def test_the_release_job_gates_a_clean_tree_on_the_downloaded_lanes(checkout, tmp_path):
    """Both lanes' good evidence: the release blocks on the missing compute-sanitizer pass
    alone (no lane runs it in these workflows), never on its own tree."""
    job = job_of("release-gate.yml", "release")
    runner = Runner(checkout, tmp_path / "runner-temp", "cpu,sm90", job["needs"])
    runner.temp.mkdir()
    ran = runner.run_job(job, evidence(checkout, ["cpu", "sm90"], failing=False))
    _, rc, out = step(ran, "Release-gate report")
    assert rc == 1 and "GATE BLOCKED: the compute-sanitizer pass is missing" in out, out
    assert "also blocking" not in out, out
    _, rc, out = step(ran, "Every lane and the merge gate passed")
    assert rc == 0, out
