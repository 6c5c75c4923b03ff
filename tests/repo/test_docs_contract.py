"""The contract a kernel is held to is written where its author reads it: docs/SPEC.md states
the bad-input rule and the low-precision and TF32 bounds the families apply, and the example
in docs/validate.md's step 2, copied as it is, passes the bad_input family."""

import re
import sys
from pathlib import Path

import pytest

from selgate.conformance.compare import ConformanceFailure
from selgate.conformance.families import bad_input
from selgate.conformance.registry import load_user_impl
from selgate.reports.repro_case import find_param

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_spec_states_the_rules_the_families_apply():
    spec = (DOCS / "SPEC.md").read_text()
    assert "## Bad input" in spec and "names the offending argument" in spec
    assert "max(1e-3, eps(dtype) * mean|ref|)" in spec  # the low-precision mean-error bound
    assert "TF32" in spec and "eps = 2^-10" in spec


def _step_2_example() -> str:
    text = (DOCS / "validate.md").read_text()
    section = text[text.index("### Bad input is part of the contract") : text.index("## 3.")]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return code


@pytest.fixture
def documented_kernel(tmp_path, monkeypatch):
    kernel = "def my_kernel(q, k, v, ranges, scale):\n    return q.new_zeros(*q.shape[:4], v.shape[-1])\n"
    (tmp_path / "documented.py").write_text(kernel + _step_2_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    yield load_user_impl("documented:selection")
    sys.modules.pop("documented", None)


@pytest.mark.parametrize("name", [b.name for b in bad_input.BAD_INPUTS if not b.varlen])
def test_the_documented_example_passes_the_bad_input_family(documented_kernel, name):
    bad, case = find_param(documented_kernel, "bad_input", f"{documented_kernel.name}-{name}")
    bad_input.check(documented_kernel, bad, case, "cpu")


def test_a_kernel_without_the_example_fails_it(tmp_path, monkeypatch):
    (tmp_path / "unchecked.py").write_text("def selection(q, k, v, ranges, *, scale=None):\n    return q[..., :1] * 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    impl = load_user_impl("unchecked:selection")
    bad, case = find_param(impl, "bad_input", f"{impl.name}-ranges-float")
    with pytest.raises(ConformanceFailure, match="accepted silently"):
        bad_input.check(impl, bad, case, "cpu")
    assert "fp32" in impl.dtypes
