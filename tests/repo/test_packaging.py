"""What the wheel declares and holds, read from pyproject.toml without building one: its torch and
triton ranges hold every version the lanes test and no untested minor beside them (an open
range let pip pull a triton no lane had run), and its packages leave the one-off GPU probes out
(scripts under probes/, run from a checkout)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROBES = ROOT / "probes"


def declared(name: str) -> Requirement:
    (req,) = [r for r in map(Requirement, PYPROJECT["project"]["dependencies"]) if r.name == name]
    return req


def versions_the_lanes_test(name: str) -> set[Version]:
    """The versions of `name` that bin/setup installs and the lanes' images and base images hold."""
    found = re.findall(rf"^{name.upper()}_PIN={name}==(\S+)$", (ROOT / "bin" / "setup").read_text(), re.M)
    for path in [*(ROOT / "docker").glob("*.Dockerfile"), ROOT / ".ci" / "docker_engine.sh"]:
        found += re.findall(rf"^(?:ARG )?{name.upper()}_VERSION=(\S+)$", path.read_text(), re.M)
    if name == "torch":
        for lane in (ROOT / "lanes").glob("*.yaml"):
            found += re.findall(r"pytorch/pytorch:(\d+\.\d+\.\d+)-", lane.read_text())
    return {Version(v) for v in found}


@pytest.mark.parametrize("name", ["torch", "triton"])
def test_the_declared_range_holds_every_tested_version_and_no_untested_minor(name):
    tested = versions_the_lanes_test(name)
    assert tested, f"no tested {name} version found"
    spec = declared(name).specifier
    assert all(spec.contains(v) for v in tested), (str(spec), sorted(map(str, tested)))
    oldest, newest = min(tested), max(tested)
    below, above = Version(f"{oldest.major}.{oldest.minor - 1}.0"), Version(f"{newest.major}.{newest.minor + 1}.0")
    assert not spec.contains(below) and not spec.contains(above), (str(spec), str(below), str(above))


def test_triton_is_required_on_linux_only_as_bin_setup_installs_it():
    marker = declared("triton").marker
    assert marker is not None
    assert marker.evaluate({"platform_system": "Linux", "sys_platform": "linux"})
    assert not marker.evaluate({"platform_system": "Darwin", "sys_platform": "darwin"})
    assert not marker.evaluate({"platform_system": "Windows", "sys_platform": "win32"})


def package_folders() -> dict[str, Path]:
    """Each package the wheel holds, and the folder its modules and data come from."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    dirs = setuptools["package-dir"]
    assert sorted(setuptools["packages"]) == sorted(dirs), "every package is mapped onto its folder"
    return {package: (ROOT / folder).resolve() for package, folder in dirs.items()}


def test_the_probes_lie_outside_every_package_folder():
    probes = sorted(PROBES.glob("*.py"))
    assert probes, "probes/ holds the one-off GPU probes"
    assert not (ROOT / "bench" / "probes").exists()
    for package, folder in package_folders().items():
        assert "probes" not in package.split("."), package
        assert not PROBES.resolve().is_relative_to(folder), (package, folder)


@pytest.mark.parametrize("probe", sorted(p.name for p in PROBES.glob("*.py")))
def test_each_probe_runs_as_a_script_importing_selgate_absolutely(probe):
    """`python3 probes/<name>.py` puts probes/ on sys.path, not a package: relative imports, or
    imports of the probes as a package, would fail there."""
    tree = ast.parse((PROBES / probe).read_text(), probe)
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom | ast.Import)]
    assert not [n.lineno for n in imports if isinstance(n, ast.ImportFrom) and n.level], "relative import"
    modules = [n.module or "" for n in imports if isinstance(n, ast.ImportFrom)]
    modules += [a.name for n in imports if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in modules if "probes" in m.split(".")], modules
    assert f"python3 probes/{probe}" in ast.get_docstring(tree), "the docstring says how to run it"


def test_the_evidence_stays_out_of_the_wheel():
    """evidence/ (committed lane runs, tens of thousands of lines) is the repository's,
    not the package's: no package maps onto it and no package-data pattern reaches into it."""
    evidence = (ROOT / "evidence").resolve()
    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    for package, folder in package_folders().items():
        assert not folder.is_relative_to(evidence), package
        shipped = [p.resolve() for pattern in data.get(package, ()) for p in folder.glob(pattern)]
        assert not [p for p in shipped if p.is_relative_to(evidence)], package
