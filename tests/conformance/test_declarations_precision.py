"""Declarations of two limitations real kernels have: `same_head_dims` (Dv must equal Dk) and
`fp32_matmul: tf32` (fp32 inputs computed with TF32 matmuls, judged by SPEC.md's TF32 rule
instead of failing the IEEE fp32 bar)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from selgate.conformance.cases import select
from selgate.conformance.compare import ConformanceFailure
from selgate.conformance.families import FAMILIES
from selgate.conformance.impl import fit
from selgate.conformance.registry import load_user_impl, resolve
from selgate.conformance.tolerances import ENV, judged_as, tolerance

sys.path.insert(0, str(Path(__file__).parents[1] / "outside"))
from tokenkernels import gather  # noqa: E402


def _tf32(x):
    """`x` rounded to nearest on TF32's 10 mantissa bits, as a TF32 matmul reads its operands;
    the gradient passes straight through."""
    bits = x.detach().contiguous().view(torch.int32)
    return x + (((bits + 0x1000) & ~0x1FFF).view(torch.float32) - x).detach()


def tf32_rounded(q, k, v, ranges, *, scale=None):
    """Exact (fp64) attention of q, k, v rounded to TF32: a TF32 kernel's error, no more."""
    return gather(_tf32(q), _tf32(k), _tf32(v), ranges, scale=scale)


def tf32_rounded_declared(q, k, v, ranges, *, scale=None):
    return tf32_rounded(q, k, v, ranges, scale=scale)


def five_percent_off_declared_tf32(q, k, v, ranges, *, scale=None):
    return gather(q, k, v, ranges, scale=scale) * 1.05


for _fn in (tf32_rounded, tf32_rounded_declared, five_percent_off_declared_tf32):
    _fn.dtypes = ("fp32",)
    _fn.backward = True
tf32_rounded_declared.fp32_matmul = "tf32"
five_percent_off_declared_tf32.fp32_matmul = "tf32"


def _impl(name):
    return load_user_impl(f"tests.conformance.test_declarations_precision:{name}")


def _cases(impl, family, most=4):
    """Up to `most` tiny fp32 cases of `family` that `impl` runs, each with keys selected."""
    fam = FAMILIES[family]
    out = [
        fit(c, impl)
        for c in select("tiny")
        if fam.applies(c) and c.pattern in ("mixed", "builder", "full") and c.seed == 0 and c.dtype == torch.float32
    ]
    return [c for c in out if not fam.skip(impl, c, "cpu")][:most]


# --- the declarations -------------------------------------------------------------------------


def test_the_declarations_parse_from_attributes_and_yaml_with_their_defaults(tmp_path):
    plain = _impl("tf32_rounded")
    assert plain.fp32_matmul == "ieee" and plain.same_head_dims is False
    assert _impl("tf32_rounded_declared").fp32_matmul == "tf32"
    path = tmp_path / "declare.yaml"
    path.write_text("same_head_dims: true\nfp32_matmul: tf32\n")
    (impl,) = resolve("tests.conformance.test_declarations_precision:tf32_rounded", declare=str(path))
    assert impl.same_head_dims is True and impl.fp32_matmul == "tf32"


@pytest.mark.parametrize(
    "text, error",
    [
        ("fp32_matmul: TF32", r"\.fp32_matmul: expected one of \['ieee', 'tf32'\], got 'TF32'"),
        ("fp32_matmul: true", r"\.fp32_matmul: expected one of \['ieee', 'tf32'\], got True"),
        ("same_head_dims: 1", r"\.same_head_dims: expected true or false, got 1"),
    ],
)
def test_a_bad_value_is_an_error_naming_the_key_and_the_allowed_values(tmp_path, text, error):
    path = tmp_path / "declare.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        resolve("tests.conformance.test_declarations_precision:tf32_rounded", declare=str(path))


def test_dv_unlike_dk_is_a_declared_skip_under_same_head_dims(tmp_path):
    path = tmp_path / "declare.yaml"
    path.write_text("same_head_dims: true\n")
    (impl,) = resolve("tests.conformance.test_declarations_precision:tf32_rounded", declare=str(path))
    parity = FAMILIES["parity"]
    cases = [fit(c, impl) for c in select("tiny") if parity.applies(c) and c.dtype == torch.float32]
    unlike = next(c for c in cases if c.shape.Dk != c.shape.Dv)
    why = parity.skip(impl, unlike, "cpu")
    assert why and f"declares Dk == Dv; case has Dk={unlike.shape.Dk}, Dv={unlike.shape.Dv}" in why
    assert parity.skip(impl, next(c for c in cases if c.shape.Dk == c.shape.Dv), "cpu") is None
    assert parity.skip(_impl("tf32_rounded"), unlike, "cpu") is None


# --- judged as TF32 ---------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["parity", "backward"])
def test_a_tf32_sized_error_fails_fp32_and_passes_when_tf32_is_declared(family):
    """Operands rounded to TF32 miss the 1e-5 fp32 bar on every case, and meet the TF32 rule."""
    undeclared, declared = _impl("tf32_rounded"), _impl("tf32_rounded_declared")
    cases = _cases(declared, family)
    assert len(cases) >= 3
    for case in cases:
        with pytest.raises(ConformanceFailure, match=r"absolute; SPEC\.md\)"):
            FAMILIES[family].check(undeclared, case, "cpu")
        FAMILIES[family].check(declared, case, "cpu")


def test_five_percent_off_fails_under_tf32_and_the_failure_names_tf32():
    impl = _impl("five_percent_off_declared_tf32")
    cases = _cases(impl, "parity")
    assert cases
    for case in cases:
        with pytest.raises(ConformanceFailure) as e:
            FAMILIES["parity"].check(impl, case, "cpu")
        assert "x plain-tf32 error" in str(e.value) and "fp32 with TF32 matmuls" in str(e.value), e.value


def test_tf32_is_the_fp16_rule_with_its_own_eps_and_its_own_override_key(monkeypatch):
    tf32 = judged_as(torch.float32, "tf32")
    assert tf32.eps == 2.0**-10 and tf32.dtype == torch.float32 and tf32.plain_scaled
    assert judged_as(torch.float32) == judged_as(torch.float32, "ieee") and not judged_as(torch.float32).plain_scaled
    assert judged_as(torch.float16, "tf32").name == "fp16"
    o, dq, lse = (tolerance(tf32, t) for t in ("o", "dq", "lse"))
    assert (o.factor, dq.factor, o.mean_floor_eps, lse.mean_floor_eps) == (2.0, 3.0, 1.0, 0.0)
    monkeypatch.setenv(ENV, "{fp32: {max_abs: 1.0e-4}, tf32: {grad: {factor: 5}}}")
    assert tolerance(tf32, "dk").factor == 5 and "tf32.dk" in tolerance(tf32, "dk").source
    assert tolerance(tf32, "o").factor == 2 and tolerance(torch.float32, "o").max_abs == 1e-4
    assert tolerance(judged_as(torch.float16), "dk").factor == 3


def test_the_plain_tf32_run_allows_tf32_matmuls_and_restores_the_settings():
    flags = torch.backends.cuda.matmul, torch.backends.cudnn
    before = [f.allow_tf32 for f in flags]
    with judged_as(torch.float32, "tf32").matmuls():
        assert all(f.allow_tf32 for f in flags)
    assert [f.allow_tf32 for f in flags] == before
    with judged_as(torch.float32).matmuls():
        assert [f.allow_tf32 for f in flags] == before
