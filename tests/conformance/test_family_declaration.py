"""A family is one declaration: a toy family, registered as a plugin would, shows up in the
markers, the matrix's tests and skips, what a check claims, the gate's required families and
the report, with nothing else written for it."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from junitparser import JUnitXml

from selgate.conformance import families
from selgate.conformance.cases import select
from selgate.conformance.impl import fit
from selgate.conformance.registry import REGISTRY, load_user_impl

from tests.reports import test_reports_gate as gate_tests

# the families mark their tests when asked for them; this process registered no family marker
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")

TOY = """
    import torch

    from selgate.conformance.cases import make_inputs
    from selgate.conformance.compare import fail
    from selgate.conformance.families import register
    from selgate.conformance.family import BACKWARD, Family


    def check(impl, case, device):
        \"\"\"o is finite.\"\"\"
        inp = make_inputs(case, device)
        o, _ = impl.forward(inp.q, inp.k, inp.v, inp.ranges, scale=inp.scale)
        if not torch.isfinite(o).all():
            fail(case.id, "o: not finite")


    def takes(c):
        return (c.size, c.mode, c.dtype, c.pattern, c.seed, c.scale) == ("tiny", "prefill", torch.float32, "mixed", 0, None)


    FAMILY = register(Family("toy", "a toy family", rank=50, check=check, applies=takes, requires=(BACKWARD,)))
"""


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy family registered in this process (and importable as `toyfamily` by a child)."""
    (tmp_path / "toyfamily.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    import toyfamily

    yield toyfamily.FAMILY
    families.FAMILIES.pop("toy")
    sys.modules.pop("toyfamily")


def test_a_registered_family_is_reported_claimed_and_skipped_from_its_declaration(toy):
    from selgate.conformance.reported import family_of, names

    assert "toy" in families.reported() and names()[-2:] == ("policy", "toy")  # rank 50: last row
    forward_only = load_user_impl("tests.conformance.test_harness_selftest:user_sdpa")
    assert families.claims(REGISTRY["reference"])["toy"] is None
    assert families.claims(forward_only)["toy"] == "does not declare backward (backward: false)"
    case = fit(next(c for c in select("tiny") if toy.applies(c)), forward_only)
    assert toy.skip(REGISTRY["reference"], case, "cpu") is None
    assert toy.skip(forward_only, case, "cpu") == f"{forward_only.name} does not declare backward (backward: false)"
    assert family_of("conformance/test_conformance.py::test_toy[reference-x]") == "toy"
    assert families.of_test("test_toy") is toy


def test_the_gate_requires_a_registered_family_and_reports_it(toy, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("selgate.reports.__main__.tree_stamp", lambda root: dict(gate_tests.TREE))
    monkeypatch.setattr(gate_tests, "REQUIRED", [*gate_tests.REQUIRED, "toy"])
    gate_tests.write_lane(tmp_path / "res", "cpu", gate_tests.passing_cases())
    rc, line = gate_tests.gate(tmp_path, capsys)
    assert rc == 1 and "family toy has no passing test" in line, line
    toy_pass = ("conformance/test_conformance.py::test_toy[reference-case0]", "pass", "toy", 0)
    shutil.rmtree(tmp_path / "res")
    gate_tests.write_lane(tmp_path / "res", "cpu", [*gate_tests.passing_cases(), toy_pass])
    rc, line = gate_tests.gate(tmp_path, capsys)
    assert rc == 0, line
    assert "| toy |" in (tmp_path / "out" / "report.md").read_text()


def test_a_family_added_by_a_plugin_runs_in_the_matrix(toy, tmp_path):
    """In a pytest run: its marker, its test over (implementation x case), its skip reason."""
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "TRITON_INTERPRET": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    plugins = ["-p", "selgate.conformance.plugin", "-p", "toyfamily", "-p", "no:cacheprovider"]
    base = [sys.executable, "-m", "pytest", *plugins, "--pyargs", "selgate.conformance"]
    markers = subprocess.run([*base, "--markers"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert "@pytest.mark.toy: conformance family: a toy family" in markers.stdout, markers.stdout[-2000:]
    xml = tmp_path / "junit.xml"
    run = subprocess.run(
        [*base, "-m", "toy", "--impl", "reference,triton-gather", "-p", "no:xdist", f"--junitxml={xml}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    # triton-gather does not declare backward: none of its toy cases runs, which fails the run
    assert run.returncode == 1 and "selgate: no case of triton-gather ran" in run.stdout, run.stdout[-3000:]
    cases = [c for suite in JUnitXml.fromfile(str(xml)) for c in suite]
    assert cases and all(c.name.startswith("test_toy[") for c in cases)
    ran = [c for c in cases if c.name.startswith("test_toy[reference-")]
    skipped = [c for c in cases if c.name.startswith("test_toy[triton-gather-")]
    assert ran and all(c.is_passed for c in ran)
    assert skipped and all(
        r.message.endswith("triton-gather does not declare backward (backward: false)") for c in skipped for r in c.result
    )
    assert len(ran) == sum(1 for c in select("tiny") if toy.applies(c)) and "fp32" in REGISTRY["reference"].dtypes
