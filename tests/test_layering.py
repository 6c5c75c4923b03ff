"""The kernel package holds kernels, their launch logic and the dispatcher: it imports nothing
from the harness around it (bench, conformance, lanes, reports), so it ships and runs alone."""

from __future__ import annotations

import ast
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
HARNESS = ("selgate.bench", "selgate.conformance", "selgate.lanes", "selgate.reports")


def harness_imports(path: Path) -> list[str]:
    """`file:line module` for every import of a harness package in `path`, at any depth
    (inside functions too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [f"{path.name}:{node.lineno} {n}" for n in names if any(n == h or n.startswith(h + ".") for h in HARNESS)]
    return found


def test_kernels_import_nothing_from_the_harness():
    files = sorted(KERNELS.rglob("*.py"))
    assert files
    assert [hit for f in files for hit in harness_imports(f)] == []


def test_the_check_finds_a_harness_import(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text(
        "import selgate.benchmarks\nfrom selgate.kernels import dispatch\n"
        "def f():\n    from selgate.bench.inputs import Problem\n    import selgate.lanes\n"
    )
    assert harness_imports(bad) == ["probe.py:4 selgate.bench.inputs", "probe.py:5 selgate.lanes"]
