"""selgate's packages stand in floors, and every import points down: a package imports the
ground floor and the floors below its own, never one beside or above it (bench and lanes share
a floor and import neither each other). So the kernels ship and run alone, the matrix runs
without lanes or reports, and a change upstairs never reaches down. docs/contributing.md
draws the same house; at any depth means imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# package -> floor; `selgate` is the ground floor (selgate/*.py: the variable registry, errors,
# device capability, strict YAML, the tree digest, the environment stamp, outcome, verdict).
FLOORS = {
    "selgate": 0,
    "configs": 0,
    "reference": 1,
    "kernels": 2,
    "conformance": 3,
    "bench": 4,
    "lanes": 4,
    "reports": 5,
}


def package_of(module: str) -> str | None:
    """The floor's package a `selgate...` module name lies in (None outside selgate)."""
    parts = module.split(".")
    if parts[0] != "selgate":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else "selgate"


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in `path` at any depth; `from selgate import x`
    counts as `selgate.x` (x may be a package: `from selgate import reports`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{a.name}" if node.module == "selgate" else node.module) for a in node.names]
    return sorted(found)


def upward(package: str, path: Path) -> list[str]:
    """`file:line module` for each import in `path` (of `package`) of a floor not below it."""
    floor = FLOORS[package]
    bad = []
    for line, module in imports(path):
        other = package_of(module)
        if other is not None and other != package and FLOORS[other] >= floor:
            bad.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{line} {module}")
    return bad


def package_files(package: str) -> list[Path]:
    folder = ROOT / package
    if package == "selgate":
        return sorted(folder.glob("*.py"))
    return sorted(p for p in folder.rglob("*.py") if "evidence" not in p.relative_to(folder).parts)


@pytest.mark.parametrize("package", list(FLOORS))
def test_every_import_points_down(package):
    files = package_files(package)
    assert files, f"no modules in {package}/"
    assert [hit for f in files for hit in upward(package, f)] == []


def test_the_floors_are_the_packages_pyproject_ships():
    import tomllib

    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    tops = {name.split(".")[1] if "." in name else name for name in shipped}
    assert tops == set(FLOORS)


def test_the_check_finds_an_import_that_does_not_point_down(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text(
        "import torch\nfrom selgate import env_vars\nfrom selgate.kernels import dispatch\n"
        "def f():\n    from selgate.bench.inputs import Problem\n    import selgate.lanes\n"
        "from selgate import reports\nfrom selgate.conformance import cases\n"
    )
    assert upward("lanes", bad) == ["probe.py:5 selgate.bench.inputs", "probe.py:7 selgate.reports"]
    assert upward("kernels", bad) == [
        "probe.py:5 selgate.bench.inputs",
        "probe.py:6 selgate.lanes",
        "probe.py:7 selgate.reports",
        "probe.py:8 selgate.conformance",
    ]
    assert upward("selgate", bad) == [
        "probe.py:3 selgate.kernels",
        "probe.py:5 selgate.bench.inputs",
        "probe.py:6 selgate.lanes",
        "probe.py:7 selgate.reports",
        "probe.py:8 selgate.conformance",
    ]
