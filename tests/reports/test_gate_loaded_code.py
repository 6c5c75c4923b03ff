"""Code a lane's pytest loads from outside the tree's digest, and files a run reads that the
digest left out: each way found ends BLOCKED. The attacks run pytest for real (with xdist, so
that what only the workers load is recorded too) on a small git repository stamped as the
checkout; the gate then reads the record, as it would a lane's."""

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from selgate.lanes import __main__ as lanes_main
from selgate.lanes import runner
from selgate.lanes.pytest_command import pytest_args
from selgate.lanes.config import load_lane
from selgate import tree as tree_mod
from selgate.reports.gate import loaded_code_blocking

from tests.reports.test_gate_adversarial import gate_lines, git, repo  # noqa: F401 (fixture)
from tests.reports.test_reports_gate import (
    PYTEST_CONFIG,
    gated_tree,  # noqa: F401 (fixture)
    passing_cases,
    write_lane,
)

# Replaces every test's body with nothing: a committed kernel bug then passes.
NEUTER = textwrap.dedent(
    """
    import pytest

    def pytest_collection_modifyitems(items):
        for item in items:
            item.runtest = lambda: None
    """
)
# Makes the stamp plugin take the small repository for the checkout (a lane's is the selgate
# checkout it runs from); the gate below leaves this shim's own record out.
SHIM = "import os, pathlib\nimport selgate.tree as t\nt.ROOT = pathlib.Path(os.environ['SHIM_ROOT'])\n"


@pytest.fixture
def kernel_repo(repo):  # noqa: F811 (the fixture)
    """`repo` with a committed failing test (the kernel bug) and the usual ignores."""
    (repo / "tests").mkdir()
    (repo / "tests" / "test_kernel.py").write_text("def test_kernel():\n    assert 1 == 2\n\ndef test_other():\n    pass\n")
    (repo / ".gitignore").write_text("*.egg-info/\nout/\n__pycache__/\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "kernel")
    return repo


def run_stamped(root, tmp_path, *args, pythonpath=()):
    """pytest with the stamp plugin on two xdist workers in the repository `root`, as a lane runs it; returns
    (environment.json, junit.xml text)."""
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "rootshim.py").write_text(SHIM)
    env = runner.run_env({"SHIM_ROOT": str(root)})
    env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), str(shim), *filter(None, [os.environ.get("PYTHONPATH")])])
    out = tmp_path / "lane"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "rootshim",
            *pytest_args(plugins=runner.lane_plugins(("xdist.plugin", "selgate.reports.stamp")), config=()),
        ]
        + ["--rootdir", str(root), "-c", str(root / "pyproject.toml"), "-n", "2", "-p", "no:cacheprovider"]
        + ["--junitxml", str(out / "junit.xml"), *args, "tests"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (out / "environment.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "environment.json").read_text()), (out / "junit.xml").read_text()


def gate_on(root, tmp_path, capsys, monkeypatch, environment):
    """The gate over a lane stamped with `environment`'s tree and record of loaded code, gating
    the repository `root` (the test's own shim left out of the record)."""
    monkeypatch.setattr("selgate.reports.__main__.tree_stamp", tree_mod.tree_stamp)
    loaded = [r for r in environment["pytest"]["loaded"] if r["name"] != "rootshim"]
    write_lane(tmp_path / "res", "cpu", passing_cases(), tree=environment["tree"], pytest={**PYTEST_CONFIG, "loaded": loaded})
    return gate_lines(tmp_path, capsys, "--tree", str(root))


@pytest.mark.parametrize(
    "where, ignore",
    [
        ("tests/zz.egg-info/conftest.py", None),  # ignored by the repository's .gitignore
        ("tests/conftest.py", ".git/info/exclude"),  # listed in the clone's own exclude file
    ],
)
def test_an_ignored_conftest_that_neuters_every_test_blocks(kernel_repo, tmp_path, capsys, monkeypatch, where, ignore):
    (kernel_repo / where).parent.mkdir(parents=True, exist_ok=True)
    (kernel_repo / where).write_text(NEUTER)
    if ignore:
        with open(kernel_repo / ignore, "a") as f:
            f.write(f"/{where}\n")
    assert (
        where
        not in subprocess.run(
            ["git", "ls-files", "--others", "--exclude-standard"], cwd=kernel_repo, capture_output=True, text=True
        ).stdout
    )
    environment, junit = run_stamped(kernel_repo, tmp_path)
    assert "<failure" not in junit  # the attack works: the kernel's failing test passed
    rc, line, blocking, _ = gate_on(kernel_repo, tmp_path, capsys, monkeypatch, environment)
    assert rc == 1 and f"required lane cpu loaded conftest {where}, ignored by git" in blocking, (line, blocking)


def test_a_plugin_from_an_ignored_folder_named_with_p_blocks(kernel_repo, tmp_path, capsys, monkeypatch):
    """`pytest -p out.neuter`, run by hand: the lane runner refuses -p, and a run that had it
    anyway is blocked by the plugin it loaded."""
    (kernel_repo / "out").mkdir()
    (kernel_repo / "out" / "neuter.py").write_text(NEUTER)
    environment, junit = run_stamped(kernel_repo, tmp_path, "-p", "out.neuter")
    assert "<failure" not in junit
    rc, line, blocking, _ = gate_on(kernel_repo, tmp_path, capsys, monkeypatch, environment)
    assert rc == 1 and "required lane cpu loaded plugin out/neuter.py (module out.neuter), ignored by git" in blocking, (
        line,
        blocking,
    )


@pytest.mark.parametrize("hook", ["sitecustomize.py", "neuter.pth"])
def test_a_startup_hook_on_pythonpath_blocks(kernel_repo, tmp_path, capsys, monkeypatch, hook):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / hook).write_text("import os\n" if hook.endswith(".pth") else "import os\nos.environ['HOOKED'] = '1'\n")
    environment, _ = run_stamped(kernel_repo, tmp_path, pythonpath=[hooks])
    rc, line, blocking, _ = gate_on(kernel_repo, tmp_path, capsys, monkeypatch, environment)
    kind = "pth" if hook.endswith(".pth") else "sitecustomize"
    assert rc == 1 and f"ran under the startup hook {kind} {os.path.realpath(hooks / hook)} (on pythonpath" in blocking, (
        line,
        blocking,
    )


def test_a_clean_run_records_what_it_loaded_and_passes(kernel_repo, tmp_path, capsys, monkeypatch):
    """The control: the same run without the attack names its conftest, tracked and stamped,
    and the gate has nothing against its loaded code."""
    (kernel_repo / "tests" / "conftest.py").write_text("X = 1\n")
    git(kernel_repo, "add", ".")
    git(kernel_repo, "commit", "-q", "-m", "conftest")
    environment, junit = run_stamped(kernel_repo, tmp_path)
    assert "<failure" in junit
    conftests = [r for r in environment["pytest"]["loaded"] if r["kind"] == "conftest"]
    assert [(r["path"], r["status"], r["stamped"]) for r in conftests] == [("tests/conftest.py", "tracked", True)]
    loaded = [r for r in environment["pytest"]["loaded"] if r["name"] != "rootshim"]
    assert loaded_code_blocking("cpu", loaded) == []
    monkeypatch.setattr("selgate.reports.__main__.tree_stamp", tree_mod.tree_stamp)
    write_lane(tmp_path / "res", "cpu", passing_cases(), tree=environment["tree"], pytest={**PYTEST_CONFIG, "loaded": loaded})
    assert gate_lines(tmp_path, capsys, "--tree", str(kernel_repo))[:2] == (0, "GATE PASSED: required lanes cpu")


def test_a_lane_of_this_checkout_loads_nothing_the_gate_refuses(tmp_path):
    """The lane's own plugins, conftests and this interpreter's startup hooks pass: no false alarm."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *pytest_args(plugins=runner.lane_plugins(), config=()),
            *runner.CONFIG_ARGS,
            "-n",
            "2",
            "-p",
            "no:cacheprovider",
        ]
        + ["--junitxml", str(tmp_path / "junit.xml"), "tests/selgate/test_env_var_names.py"],
        cwd=runner.ROOT,
        env=runner.run_env({}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (tmp_path / "environment.json").exists(), proc.stdout[-3000:]
    loaded = json.loads((tmp_path / "environment.json").read_text())["pytest"]["loaded"]
    assert {"selgate.reports.stamp", "xdist.plugin", "pytest_timeout"} <= {r["name"] for r in loaded}
    assert loaded_code_blocking("cpu", loaded) == []


@pytest.mark.parametrize(
    "extra, option",
    [
        (["-p", "reports.out.neuter"], "-p"),
        (["-preports.out.neuter"], "-p"),
        (["-vp", "reports.out.neuter"], "-p"),
        (["--confcutdir", "/"], "--confcutdir"),
        (["-c", "pytest.ini"], "-c"),
        (["--rootdir=/tmp"], "--rootdir"),
        (["--import-mode=append"], "--import-mode"),
        (["-o", "addopts=-p reports.out.neuter"], "-o"),
        (["--override-ini=python_files=*.py"], "--override-ini"),
        (["--pyargs", "evil"], "--pyargs"),
        (["-W", "ignore::reports.out.neuter.Warning"], "-W"),
        (["--pdbcls=reports.out.neuter:Pdb"], "--pdbcls"),
        (["--tx", "popen//python=/tmp/python"], "--tx"),
    ],
)
def test_extra_arguments_that_load_code_are_refused_by_the_lane(extra, option):
    with pytest.raises(ValueError, match=f"^{re.escape(extra[0])}: the lane refuses {option} among extra pytest arguments"):
        runner.plan_lane(load_lane("cpu"), capability=None, extra=extra)


def test_harmless_extra_arguments_still_run():
    args = runner.plan_lane(load_lane("cpu"), capability=None, extra=["-x", "-o", "log_cli=true", "-rA"]).pytest_args
    assert args[-4:] == ["-x", "-o", "log_cli=true", "-rA"]


def test_a_lane_run_with_a_p_plugin_never_runs_and_the_gate_blocks(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runner, "OUT_ROOT", tmp_path / "res")
    monkeypatch.setattr(lanes_main, "run_plan", lambda plan, docker=False: 0)  # what would run, if planned
    assert lanes_main.main(["run", "cpu", "--", "-p", "reports.out.neuter"]) == 2
    assert "the lane refuses -p" in capsys.readouterr().err
    rc, line, _, _ = gate_lines(tmp_path, capsys)
    assert rc == 1 and line.startswith("GATE BLOCKED: required lane cpu never ran: the lane runner refused it (-p: "), line


@pytest.mark.parametrize(
    "record, expected",
    [
        (
            {
                "kind": "conftest",
                "name": "c",
                "path": "tests/conftest.py",
                "where": "checkout",
                "status": "tracked",
                "stamped": True,
            },
            None,
        ),
        ({"kind": "conftest", "name": "c", "path": "t/conftest.py", "where": "checkout", "status": "untracked"}, "untracked"),
        ({"kind": "conftest", "name": "c", "path": "t/conftest.py", "where": "checkout", "status": None}, "left out of the tree"),
        (
            {
                "kind": "conftest",
                "name": "c",
                "path": "t/conftest.py",
                "where": "checkout",
                "status": "tracked",
                "stamped": False,
            },
            "content other than the tree stamped",
        ),
        ({"kind": "conftest", "name": "c", "path": "/elsewhere/conftest.py", "where": "other"}, "from outside the checkout"),
        ({"kind": "plugin", "name": "xdist.plugin", "path": "/venv/xdist/plugin.py", "where": "installation"}, None),
        ({"kind": "plugin", "name": "_pytest.main", "path": "/py/_pytest/main.py", "where": "installation"}, None),
        (
            {"kind": "plugin", "name": "pytest_randomly", "path": "/venv/pytest_randomly.py", "where": "installation"},
            "does not name",
        ),
        ({"kind": "pth", "name": "x.pth", "path": "/venv/site-packages/x.pth", "where": "installation"}, None),
        ({"kind": "pth", "name": "x.pth", "path": "/src/x.pth", "where": "checkout"}, "startup hook pth /src/x.pth (on checkout"),
        (
            {"kind": "sitecustomize", "name": "sitecustomize", "path": "/p/sitecustomize.py", "where": "pythonpath"},
            "(on pythonpath",
        ),
        # the machine's own: Debian's system sitecustomize, which the CPU lane's image runs under
        ({"kind": "sitecustomize", "name": "sitecustomize", "path": "/etc/python3.11/sitecustomize.py", "where": "other"}, None),
        # a copy without git (a lane's image): the digest is every file, and this one is in it
        ({"kind": "plugin", "name": "p", "path": "t/p.py", "where": "checkout", "status": None, "stamped": True}, None),
    ],
)
def test_the_gate_judges_each_loaded_record(tmp_path, capsys, record, expected):
    write_lane(tmp_path / "res", "cpu", passing_cases(), pytest={**PYTEST_CONFIG, "loaded": [record]})
    rc, line, blocking, _ = gate_lines(tmp_path, capsys)
    if expected is None:
        assert (rc, line) == (0, "GATE PASSED: required lanes cpu")
    else:
        assert rc == 1 and line.startswith("GATE BLOCKED: required lane cpu ") and expected in line, line


# The digest: every file a run can read ------------------------------------------------------

READ_BY_TESTS = ["docs/configuration.md", "bin/gate", "CHANGELOG.md", ".ci/check-lanes", "bin/setup", "tests/helpers.py"]


@pytest.fixture
def full_repo(repo):  # noqa: F811 (the fixture)
    for path in READ_BY_TESTS:
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(f"{path} as committed\n")
    (repo / ".gitignore").write_text("*.egg-info/\nreports/out/\n__pycache__/\n.venv/\ntests/data/\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "files tests read")
    return repo


@pytest.mark.parametrize("path", READ_BY_TESTS)
def test_editing_a_file_tests_read_after_the_lane_blocks(full_repo, tmp_path, capsys, monkeypatch, path):
    monkeypatch.setattr("selgate.reports.__main__.tree_stamp", tree_mod.tree_stamp)
    write_lane(tmp_path / "res", "cpu", passing_cases(), tree=tree_mod.tree_stamp(full_repo))
    assert gate_lines(tmp_path, capsys, "--tree", str(full_repo))[0] == 0
    (full_repo / path).write_text("edited after the lane ran\n")
    rc, line, _, _ = gate_lines(tmp_path, capsys, "--tree", str(full_repo))
    assert rc == 1 and line.startswith("GATE BLOCKED: required lane cpu ran other files than this tree has"), line


def test_ignored_files_count_and_outputs_do_not(full_repo):
    clean = tree_mod.tree_stamp(full_repo)
    assert clean["dirty"] is False and clean["ignored"] == []
    for output in (
        "reports/out/cpu/junit.xml",
        "tests/__pycache__/x.cpython-311.pyc",
        ".venv/lib/x.pth",
        "pkg.egg-info/PKG-INFO",
    ):
        (full_repo / output).parent.mkdir(parents=True, exist_ok=True)
        (full_repo / output).write_text("written by a run\n")
    assert tree_mod.tree_stamp(full_repo) == clean
    (full_repo / "tests" / "data").mkdir(parents=True)
    (full_repo / "tests" / "data" / "golden.json").write_text("{}\n")  # ignored, read by a test
    (full_repo / "tests" / "zz.egg-info").mkdir()
    (full_repo / "tests" / "zz.egg-info" / "conftest.py").write_text(NEUTER)  # egg-info only at the root is pip's
    stamp = tree_mod.tree_stamp(full_repo)
    assert stamp["digest"] != clean["digest"] and stamp["dirty"] is True
    assert stamp["ignored"] == ["tests/data/golden.json", "tests/zz.egg-info/conftest.py"]
    assert tree_mod.untracked_config(stamp) == ["tests/zz.egg-info/conftest.py"]


@pytest.mark.parametrize("change", ["docs/configuration.md", "tests/data/golden.json"])
def test_a_release_sees_an_edited_doc_or_an_ignored_file(full_repo, tmp_path, capsys, monkeypatch, change):
    monkeypatch.setattr("selgate.reports.__main__.tree_stamp", tree_mod.tree_stamp)
    (full_repo / change).parent.mkdir(parents=True, exist_ok=True)
    (full_repo / change).write_text("not committed\n")
    stamp = tree_mod.tree_stamp(full_repo)
    for lane in ("cpu", "sm90"):
        write_lane(tmp_path / "res", lane, passing_cases() + passing_cases(["dtype"]), tree=stamp)
    rc, line, _, _ = gate_lines(tmp_path, capsys, "--tree", str(full_repo), "--profile", "release")
    assert rc == 1 and line.startswith("GATE BLOCKED: the tree being gated has uncommitted changes"), line


def test_what_no_run_reads_leaves_the_digest_alone_and_a_mismatch_names_the_files(full_repo, tmp_path, capsys, monkeypatch):
    """A wheel built into dist/ (docs/validate.md's own step), lane results downloaded into
    results/, notes at the root, editor files anywhere: none can change a run. A file that can (code
    anywhere, any file in a project folder) changes the digest, and the block names it."""
    monkeypatch.setattr("selgate.reports.__main__.tree_stamp", tree_mod.tree_stamp)
    (full_repo / "configs" / "classes").mkdir(parents=True)
    (full_repo / "configs" / "classes" / "sm90.yaml").write_text("capabilities: ['9.0']\n")
    git(full_repo, "add", ".")
    git(full_repo, "commit", "-q", "-m", "a class profile")
    clean = tree_mod.tree_stamp(full_repo)
    for path in ("dist/selgate-0.1.0-py3-none-any.whl", "results/cpu/junit.xml", "results/cpu/environment.json",
                 "notes.md", ".idea/workspace.xml", "report.md~", "docs/gate.md~", "kernels/.dispatch.py.swp",
                 "conformance/#cases.py#", "docs/.DS_Store"):  # fmt: skip
        (full_repo / path).parent.mkdir(parents=True, exist_ok=True)
        (full_repo / path).write_text("not read by any run\n")
    assert tree_mod.tree_stamp(full_repo)["digest"] == clean["digest"]
    write_lane(tmp_path / "res", "cpu", passing_cases(), tree=clean)
    assert gate_lines(tmp_path, capsys, "--tree", str(full_repo))[0] == 0
    (full_repo / "results" / "sitecustomize.py").write_text("import os\n")  # code: on the path of a run from the root
    (full_repo / "docs" / "extra.md").write_text("a test may glob docs/\n")
    (full_repo / "bin" / "setup").write_text("edited\n")
    # named like an editor's file, yet taken by a glob of the configuration or by pytest's collection
    (full_repo / "configs" / "classes" / ".#sm90.yaml").write_text("capabilities: ['9.0']\n")
    (full_repo / "tests" / ".#evil_test.py").write_text("def test_evil(): pass\n")
    rc, line, _, _ = gate_lines(tmp_path, capsys, "--tree", str(full_repo))
    assert rc == 1 and "ran other files than this tree has" in line, line
    for named in ("bin/setup (changed)", "configs/classes/.#sm90.yaml (only here)", "docs/extra.md (only here)"):
        assert named in line, line
    stamp = tree_mod.tree_stamp(full_repo)
    assert {"results/sitecustomize.py", "tests/.#evil_test.py"} <= set(stamp["untracked"] + stamp["ignored"]), stamp


def test_the_stamp_of_this_checkout_is_fast():
    start = time.perf_counter()
    stamp = tree_mod.tree_stamp()
    assert stamp["files"] > 100 and time.perf_counter() - start < 5
