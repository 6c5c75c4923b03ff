"""bin/setup on a machine whose torch lives in a virtual environment (most GPU hosts): the
venv it makes imports that torch, and no second torch is installed. A venv made here stands
in for the host's environment, with a stand-in `torch` package (a module with __version__
and its package metadata, never the real one). Hermetic: setup runs with
SELGATE_SETUP_DRY_RUN=1 (its pip installs are printed, not run) and pip's own checks run
with --no-index and no configuration files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "bin" / "setup"
FAKE_VERSION = "2.11.0+fake"

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="bin/setup is a bash script")


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def fake_package(site: Path, name: str, version: str, body: str | None = None) -> Path:
    """A package `name` in `site` with its dist-info, so that pip sees it installed too."""
    pkg = site / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body if body is not None else f"__version__ = {version!r}\n")
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return pkg / "__init__.py"


def make_venv(path: Path, *flags: str) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", *flags, str(path)], check=True)
    return path / "bin" / "python"


@pytest.fixture
def host(tmp_path):
    """The GPU host's python: itself a venv (not the base interpreter) holding torch."""
    python = make_venv(tmp_path / "host")
    torch_file = fake_package(site_packages(python), "torch", FAKE_VERSION)
    return python, torch_file


def clean_env(**extra) -> dict:
    """No pip configuration of this machine (indexes, find-links, constraints) leaks in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "SELGATE_", "PYTHON", "VIRTUAL_ENV"))}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", **extra}


def run_setup(python: Path, venv: Path, **extra) -> subprocess.CompletedProcess:
    env = clean_env(PYTHON=str(python), SELGATE_VENV=str(venv), SELGATE_SETUP_DRY_RUN="1", **extra)
    return subprocess.run(["bash", str(SETUP)], env=env, capture_output=True, text=True, timeout=120)


def planned_installs(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("setup: would run:")]


def installs_torch(lines: list[str]) -> bool:
    """A planned pip install naming torch itself (not the constraints file)."""
    return any(re.search(r"(?<![\w/.-])torch([=<>!~ ]|$)", line) for line in lines)


def venv_torch(venv: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import torch; print(torch.__file__, torch.__version__)"],
        env=clean_env(),
        capture_output=True,
        text=True,
    )


def test_setup_reuses_a_torch_that_lives_in_a_venv_and_installs_no_second_one(tmp_path, host):
    python, torch_file = host
    venv = tmp_path / "selgate-venv"
    proc = run_setup(python, venv)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"setup: creating {venv} from {python} (torch {FAKE_VERSION} found)" in proc.stdout
    assert f"reusing the torch of {python}: {FAKE_VERSION}" in proc.stdout

    # The venv imports the host's torch: the same file, the same version.
    seen = venv_torch(venv)
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.split() == [str(torch_file.resolve()), FAKE_VERSION]

    # No pip install of torch is planned, and every planned install is constrained to the
    # host's torch, so resolving selgate's requirements can only keep it.
    plan = planned_installs(proc.stdout)
    assert plan and not installs_torch(plan), plan
    constraints = venv / "selgate-host-constraints.txt"
    assert constraints.read_text().splitlines() == [f"torch=={FAKE_VERSION}"]
    assert all(f"-c {constraints}" in line for line in plan), plan

    # pip itself, offline, sees that torch as installed: pyproject's `torch>=2.4` is satisfied.
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--no-index", "-c", str(constraints), "torch>=2.4"],
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert pip.returncode == 0 and "Requirement already satisfied: torch>=2.4" in pip.stdout, pip.stdout + pip.stderr


def test_without_its_pth_file_the_venv_loses_the_hosts_torch(tmp_path, host):
    """The known failure: --system-site-packages exposes the BASE interpreter's packages, not
    those of the venv that python3 is; the .pth file is what brings the host's torch back."""
    python, torch_file = host
    venv = tmp_path / "selgate-venv"
    make_venv(venv, "--system-site-packages")  # what setup makes, less pip: faster
    assert run_setup(python, venv).returncode == 0
    pth = site_packages(venv / "bin" / "python") / "selgate-host-env.pth"
    assert str(torch_file.parent.parent.resolve()) in pth.read_text().splitlines()
    pth.unlink()
    seen = venv_torch(venv)
    assert seen.returncode != 0 or seen.stdout.split()[0] != str(torch_file.resolve())


def test_a_venv_whose_own_torch_shadows_the_hosts_is_refused(tmp_path, host):
    python, torch_file = host
    venv = tmp_path / "selgate-venv"
    make_venv(venv, "--system-site-packages")
    fake_package(site_packages(venv / "bin" / "python"), "torch", "2.13.0")
    proc = run_setup(python, venv)
    assert proc.returncode == 1
    assert f"does not import the torch of {python} ({torch_file})" in proc.stderr
    assert not planned_installs(proc.stdout)


def test_a_machine_without_torch_gets_the_pinned_torch_and_triton(tmp_path):
    """CPU machines keep their behaviour. Stand-ins that fail to import on PYTHONPATH hide any
    torch or triton the base interpreter may have."""
    python = make_venv(tmp_path / "host")
    hidden = tmp_path / "hidden"
    for name in ("torch", "triton"):
        (hidden / name).mkdir(parents=True)
        (hidden / name / "__init__.py").write_text(f"raise ModuleNotFoundError('no {name} here')\n")
    venv = tmp_path / "selgate-venv"
    make_venv(venv, "--system-site-packages")  # what setup makes, less pip: faster
    proc = run_setup(python, venv, PYTHONPATH=str(hidden))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = planned_installs(proc.stdout)
    assert any(line.endswith(" torch==2.13.0") for line in plan), plan
    if sys.platform.startswith("linux"):
        assert any(line.endswith(" triton==3.6.0") for line in plan), plan
    assert "reusing" not in proc.stdout and not any("-c " in line for line in plan)


def test_selgate_is_installed_even_where_the_host_holds_every_other_requirement(tmp_path, host):
    """From the checkout `import selgate` finds ./selgate uninstalled; with junitparser, yaml
    and the rest in the host's environment, a check on imports alone skipped the install and
    the lane then failed on `No module named selgate.lanes`."""
    python, _ = host
    for name in ("junitparser", "yaml", "xdist", "hypothesis", "pytest_timeout", "numpy", "docker"):
        fake_package(site_packages(python), name, "1.0")
    proc = run_setup(python, tmp_path / "selgate-venv")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = planned_installs(proc.stdout)
    assert any(" -e " in line for line in plan), plan


def hide(folder: Path, *names: str) -> Path:
    """Stand-ins that fail to import, for PYTHONPATH: they hide what the base interpreter holds."""
    for name in names:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f"raise ModuleNotFoundError('no {name} here')\n")
    return folder


def plan_with_build_tools(tmp_path, host, pip: str, setuptools: str | None, wheel: str | None) -> list[str]:
    """setup's output where the host's environment (which .venv sees first) holds these
    versions of pip, setuptools and wheel; None: the module does not import."""
    python, _ = host
    site = site_packages(python)
    fake_package(site, "pip", pip)
    for name, version in (("setuptools", setuptools), ("wheel", wheel)):
        if version is not None:
            fake_package(site, name, version)
    hidden = hide(tmp_path / "hidden", *(name for name, v in (("setuptools", setuptools), ("wheel", wheel)) if v is None))
    venv = tmp_path / "selgate-venv"
    make_venv(venv, "--system-site-packages")  # what setup makes, less pip: faster
    proc = run_setup(python, venv, PYTHONPATH=str(hidden))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


def editable_install(lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith("setup: would run:") and " -e " in line)


@pytest.mark.parametrize(
    "setuptools, wheel, says",
    [
        ("65.5.0", None, "upgrading setuptools 65.5.0 -> >=70.1"),  # what Python 3.11's venv bundles
        ("65.5.0", "0.43.0", "upgrading setuptools 65.5.0 -> >=70.1"),  # below pyproject's build requirement
        ("69.5.1", None, "upgrading setuptools 69.5.1 -> >=70.1"),
        (None, None, "installing setuptools>=70.1"),  # Python 3.12's venv bundles none
        ("69.5.1", "0.43.0", None),  # bdist_wheel from the wheel package
        ("70.1.0", None, None),  # bdist_wheel built in
        ("84.2.1", None, None),
    ],
)
def test_setuptools_that_cannot_build_the_editable_wheel_is_upgraded_first(tmp_path, host, setuptools, wheel, says):
    """`import setuptools` succeeding is not enough: the editable install runs without build
    isolation, and setuptools before 70.1 without the wheel package fails on bdist_wheel."""
    lines = plan_with_build_tools(tmp_path, host, "24.0", setuptools, wheel)
    upgrades = [i for i, line in enumerate(lines) if line.startswith("setup: would run:") and "setuptools>=70.1" in line]
    if says is None:
        said = [line for line in lines if line.startswith(("setup: upgrading setuptools", "setup: installing setuptools"))]
        assert not upgrades and not said, lines
    else:
        assert any(line.startswith(f"setup: {says} (") for line in lines), lines
        assert len(upgrades) == 1 and upgrades[0] < editable_install(lines), lines


@pytest.mark.parametrize("pip, upgraded", [("21.2.4", True), ("9.0.1", True), ("21.3", False), ("24.0", False)])
def test_pip_too_old_for_editable_pyproject_installs_is_upgraded_first(tmp_path, host, pip, upgraded):
    lines = plan_with_build_tools(tmp_path, host, pip, "84.2.1", None)
    upgrades = [i for i, line in enumerate(lines) if line.startswith("setup: would run:") and line.endswith(" pip>=21.3")]
    if upgraded:
        assert f"setup: upgrading pip {pip} -> >=21.3 (editable installs of a pyproject) ..." in lines, lines
        assert len(upgrades) == 1 and upgrades[0] < editable_install(lines), lines
    else:
        assert not upgrades, lines


def test_each_step_says_what_it_installs(tmp_path):
    """A newcomer's first run takes minutes: every pip install is announced by one line saying
    what it installs, and pip itself stays quiet."""
    python = make_venv(tmp_path / "host")
    venv = tmp_path / "selgate-venv"
    make_venv(venv, "--system-site-packages")  # what setup makes, less pip: faster
    proc = run_setup(python, venv, PYTHONPATH=str(hide(tmp_path / "hidden", "torch", "triton")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "setup: installing torch==2.13.0 ..." in lines
    assert "setup: installing selgate (editable) and its test requirements ..." in lines
    for i, line in enumerate(lines):
        if line.startswith("setup: would run:"):
            assert " -q " in line, line
            said = next(s for s in reversed(lines[:i]) if not s.startswith("setup: would run:"))
            assert said.startswith(("setup: installing ", "setup: upgrading ")) and said.endswith(" ..."), (said, line)
