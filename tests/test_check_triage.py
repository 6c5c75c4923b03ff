"""`selgate check`'s root causes: failures grouped by a case-independent signature, the
smallest case of each, a bounded report section, and reproducer scripts that run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from selgate.reports import triage
from selgate.conformance.cases import select
from selgate.conformance.compare import ConformanceFailure
from selgate.conformance.families import FAMILIES
from selgate.conformance.families.bad_input import check as check_bad_input
from selgate.conformance.registry import REGISTRY, fit, load_user_impl
from selgate.reports.results import CaseResult

OUTSIDE = Path(__file__).parent / "outside"
IMPL = "fla.ops-nsa:parallel_nsa-v2"  # ':', '.' and '-' in an implementation's name
FAILURE = "selgate.conformance.compare.ConformanceFailure: "
CASES = [c for c in select("small") if c.mode != "varlen" and c.dtype != torch.float64]


def result(family, case_id, message, test=None, impl=IMPL):
    """A failure as `selgate check` reads it from JUnit: test `test` of the family's module."""
    nodeid = f"test_{family}.py::{test or 'test_' + family}[{impl}-{case_id}]"
    return CaseResult("check", nodeid, family, "fail", message)


def over(case_id, name, err, bound=1e-5, index=(0, 1, 0, 2, 3)):
    return (
        f"{FAILURE}[{case_id}] {name}: max abs err {err:.3e} (bound {bound:.3e}: absolute; SPEC.md), "
        f"mean abs err {err / 10:.3e} (bound {bound:.3e}); worst at index {index}: got 0.5, reference 0.49"
    )


def differ(case_id, name, why, got="nan", want="0.0", count=12, index=(0, 1)):
    return f"{FAILURE}[{case_id}] {name}: {count} elements differ ({why}); first at index {index}: {got} vs {want}"


def nonfinite(case_id, name, got="nan", ref="0.5", index=(0, 1, 0, 2, 3)):
    return (
        f"{FAILURE}[{case_id}] {name}: 3 non-finite or wrong special values, first at index {index}: got {got}, reference {ref}"
    )


def fla_like():
    """170 failures of a kernel like fla's: NaN in o on empty rows, TF32-size errors in fp32
    (o, dq, dk), NaN gradients of keys nothing selects, and a few non-repeatable backward runs."""
    fp32 = [c for c in CASES if c.dtype == torch.float32]
    out = [
        result("empty_ranges", c.id, differ(c.id, "o[empty rows]", "an empty row gives o = 0 exactly", index=(i, 3)))
        for i, c in enumerate(CASES[:60])
    ]
    out += [result("parity", c.id, over(c.id, "o", 1.2e-3 + 1e-5 * i, index=(i, 0, 1, 2, 3))) for i, c in enumerate(fp32[:50])]
    out += [result("backward", c.id, over(c.id, "dq", 1.8e-3 - 1e-5 * i)) for i, c in enumerate(fp32[:20])]
    out += [result("backward", c.id, over(c.id, "dk", 1.5e-3, bound=1.2e-5)) for c in fp32[20:30]]
    out += [
        result("bounds", c.id, differ(c.id, "dk[tail keys]", "nothing selects them", count=i + 1, index=(0, 1, i)))
        for i, c in enumerate(fp32[:25])
    ]
    out += [
        result(
            "determinism",
            c.id,
            differ(c.id, "dq", f"run {2 + i % 3} vs run 1 must be bitwise identical", got="0.125", want="0.25"),
            test="test_determinism_backward",
        )
        for i, c in enumerate(fp32[:5])
    ]
    return out


def test_fla_like_failures_collapse_to_their_root_causes():
    failures = fla_like()
    assert len(failures) == 170
    causes = triage.group(failures)
    assert len(causes) <= 6
    got = {c.signature: c.count for c in causes}
    assert got == {
        "o: NaN on rows that select nothing (where o is exactly 0)": 60,
        "o: max abs err 10^2x over its bound": 50,
        "dk[tail keys]: NaN where 0 is expected (nothing selects them)": 25,
        "dq: max abs err 10^2x over its bound": 20,
        "dk: max abs err 10^2x over its bound": 10,
        "dq: not bitwise identical across runs": 5,
    }
    assert [c.count for c in causes] == sorted((c.count for c in causes), reverse=True)
    empty = causes[0]
    assert empty.families == ("empty_ranges",) and empty.dtypes == ("bf16", "fp16", "fp32")
    assert causes[1].families == ("parity",) and causes[1].dtypes == ("fp32",)
    assert empty.example == empty.smallest.message and empty.smallest in failures


@pytest.mark.parametrize(
    "make",
    [
        lambda cid, i: over(cid, "o", 1.2e-3 * (1 + i / 10), index=(i, 0, i, 1, 2)),
        lambda cid, i: differ(cid, "dk[tail keys]", "nothing selects them", count=3 + i, index=(i, i + 1)),
        lambda cid, i: nonfinite(cid, "lse", got=["nan", "-nan"][i], ref=["0.5", "-3.25"][i], index=(i, 2)),
        lambda cid, i: differ(cid, "o", f"run {2 + i} vs run 1 must be bitwise identical", got=f"0.{i + 1}", want="0.7"),
        lambda cid, i: f"{FAILURE}[{cid}] o: shape {(2 + i, 9, 2, 4, 16 + i)}, expected {(2 + i, 9, 2, 4, 8 + i)}",
        lambda cid, i: (
            f"RuntimeError: shape '[{i + 2}, 9]' is invalid for input of size {1152 * (i + 1)} at 0x7f{i}a in /tmp/k{i}/x.py"
        ),
        lambda cid, i: (
            f"worker 'gw{i}' crashed while running 'selgate/conformance/test_conformance.py::test_parity[{IMPL}-{cid}]'"
        ),
        lambda cid, i: f"Failed: Timeout >{300 + i}.0s",
    ],
)
def test_one_failure_on_two_cases_has_one_signature(make):
    a, b = CASES[0], CASES[-1]
    assert (a.id, a.seed, a.shape) != (b.id, b.seed, b.shape)
    sig_a = triage.signature(result("parity", a.id, make(a.id, 0)))
    sig_b = triage.signature(result("backward", b.id, make(b.id, 1)))
    assert sig_a == sig_b
    assert a.id not in sig_a and b.id not in sig_b and len(sig_a) <= triage.MAX_SIGNATURE


def test_different_failures_have_different_signatures():
    cid = CASES[0].id

    def sig(message):
        return triage.signature(result("parity", cid, message))

    assert sig(over(cid, "o", 1e-3)) != sig(over(cid, "dk", 1e-3))
    assert sig(nonfinite(cid, "o")) != sig(over(cid, "o", 1e-3))
    assert sig(over(cid, "o", 2e-4)) != sig(over(cid, "o", 2e-2))  # 10x over vs 1000x over
    assert sig(nonfinite(cid, "o", got="nan")) != sig(nonfinite(cid, "o", got="inf"))
    assert sig(differ(cid, "dk[tail keys]", "nothing selects them")) != sig(differ(cid, "dv[tail keys]", "nothing selects them"))
    assert sig(over(cid, "o", 2e-4)) == "o: max abs err 10^1x over its bound"
    assert sig(over(cid, "o", 2e-2)) == "o: max abs err 10^3x over its bound"
    assert sig(nonfinite(cid, "o")) == "o: NaN where the reference is finite"


def test_signatures_of_each_kind_of_message():
    cid = "prefill-B2S9Skv33-G2h4-D16x8-n4-mixed-bs8-fp32-s0"
    cases = {
        f"{FAILURE}[{cid}] o: shape (2, 9, 2, 4, 16), expected (2, 9, 2, 4, 8)": "o: shape differs in Dv",
        f"{FAILURE}[{cid}] lse: shape (2, 9, 2), expected (2, 9, 2, 4)": "lse: 3 dims, expected 4",
        f"{FAILURE}[{cid}] o: got torch.float32 (2, 9, 2, 4, 8) on cpu, expected torch.float16 (2, 9, 2, 4, 8) on cpu": (
            "o: wrong dtype (got torch.float32)"
        ),
        nonfinite(cid, "lse", got="0.0", ref="-inf"): "lse: finite where the reference is -Inf",
        f"{FAILURE}[{cid}] gradcheck: Jacobian mismatch for output 0 with respect to input 1,": (
            "gradcheck: Jacobian mismatch for o with respect to k"
        ),
        f"{FAILURE}[{cid}] bad input q-rank: ValueError does not name 'q': expected 5 dims, got 4": (
            "bad input q-rank: ValueError does not name 'q'"
        ),
        f"{FAILURE}[{cid}] bad input q-rank: accepted silently (expected an error naming 'q')": (
            "bad input q-rank: accepted silently"
        ),
        "TypeError: an implementation declaring lse must return (o, lse), got Tensor": (
            "TypeError: an implementation declaring lse must return (o, lse), got Tensor"
        ),
        f"{FAILURE}[{cid} (o-only path)] o: max abs err 1.800e-01 (bound 1.000e-05: absolute; SPEC.md)": (
            "o: max abs err 10^4x over its bound (o-only path)"
        ),
        # the max within its bound, the mean 50x over
        over(cid, "o", 1e-6).replace("1.000e-07", "5.000e-04"): "o: mean abs err 10^1x over its bound",
        nonfinite(cid, "o").removeprefix(FAILURE): "o: NaN where the reference is finite",
        f"{over(cid, 'o', 1e-3)}; then worker 'gw0' crashed while running 'x'": "o: max abs err 10^2x over its bound",
        "[XPASS(strict)] NaN on empty rows": "a declared expected failure passed (XPASS strict)",
    }
    for message, want in cases.items():
        assert triage.signature(result("dtype", cid, message)) == want, message


def test_errors_spread_over_adjacent_powers_of_ten_stay_one_cause():
    def cause(*errors):
        return {
            c.signature: c.count
            for c in triage.group([result("parity", CASES[i].id, over(CASES[i].id, "o", e)) for i, e in enumerate(errors)])
        }

    assert cause(9e-5, 1.1e-4, 2e-4) == {"o: max abs err 1-10x to 10^1x over its bound": 3}
    assert cause(2e-4, 3e-3, 4e-2, 5e-2) == {"o: max abs err 10^1x to 10^3x over its bound": 4}
    assert cause(2e-4, 2e-2) == {"o: max abs err 10^1x over its bound": 1, "o: max abs err 10^3x over its bound": 1}


def test_the_smallest_case_represents_its_cause():
    def elements(c):
        s = c.shape
        return s.B * s.G * (s.S * s.h * s.Dk + s.S_kv * (s.Dk + s.Dv))

    failures = [result("parity", c.id, over(c.id, "o", 1e-3)) for c in reversed(CASES)]
    (cause,) = triage.group(failures)
    assert cause.count == len(CASES)
    assert cause.smallest == min(failures, key=lambda r: (elements(CASES[failures[::-1].index(r)]), r.nodeid))
    # equal size: the first nodeid
    cid = CASES[0].id
    (cause,) = triage.group([result("parity", cid, over(cid, "o", 1e-3)), result("group", cid, over(cid, "o", 1e-3))])
    assert cause.smallest.nodeid.startswith("test_group.py::") and cause.families == ("group", "parity")
    # varlen ids are parsed too; a result with no case id comes last
    varlen = next(c for c in select("small") if c.mode == "varlen" and c.size == "tiny")
    bigger = next(c for c in CASES if c.size == "small")
    crash = CaseResult("check", "conformance/test_conformance.py", "parity", "error", "TypeError: x")
    (cause,) = triage.group([crash, result("parity", bigger.id, "TypeError: x"), result("varlen", varlen.id, "TypeError: x")])
    assert cause.smallest.family == "varlen" and cause.dtypes == (triage.CASE_ID.search(varlen.id)["dtype"],)


def test_the_report_section_stays_short_whatever_the_failure_count():
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"]
    failures = fla_like() * 20
    for i in range(5000 - len(failures)):
        c = CASES[i % len(CASES)]
        failures.append(result("parity", c.id, f"KeyError: no {words[i % 10]}{words[i // 10 % 10]} in table {i} " + "x" * 900))
    assert len(failures) == 5000
    causes = triage.group(failures)
    assert len(causes) == 6 + 100
    paths = {c.signature: Path(f"repro/cause-{n}.py") for n, c in enumerate(causes, 1)}
    lines = triage.render(causes, paths)
    assert len(lines) <= 5 + 4 * 8
    assert all(len(line) < 700 and "\n" not in line for line in lines)
    assert lines[0] == "## Root causes"
    rest = causes[8:]
    assert lines[-1] == f"And {len(rest)} more cause(s) covering {sum(c.count for c in rest)} failure(s): see junit.xml."
    assert "`python repro/cause-1.py`" in "\n".join(lines)
    assert triage.render([], {}) == []
    assert len(triage.render(causes[:2], {})) == 4 + 2 * 4


def test_bad_inputs_the_kernel_accepts_point_at_check_inputs():
    """Missing input checks came out as one cause per bad input (ten for one omission): the
    section says what fixes them at once."""
    accepted = [f"{FAILURE}[x] bad input {name}: accepted silently (expected an error naming {arg!r})" for name, arg in
                (("q-rank", "q"), ("k-dtype", "k"), ("scale-nan", "scale"))]  # fmt: skip
    causes = triage.group([result("bad_input", n, m) for n, m in zip(("q-rank", "k-dtype", "scale-nan"), accepted)])
    lines = triage.render(causes, {})
    assert len(causes) == 3 and "3 of these causes are bad inputs" in lines[-1] and "check_inputs(" in lines[-1]
    assert not any("check_inputs" in line for line in triage.render(causes[:1], {}))


# --- reproducers ------------------------------------------------------------------------------

KERNELS = '''"""Kernels of an outside author for the reproducer tests: off by a little, and one that
validates nothing."""
import torch
from tokenkernels import off_by_a_little  # noqa: F401


def lax(q, k, v, ranges, *, scale=None):
    return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=v.dtype)


lax.dtypes = ("fp32",)
'''


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    """tmp_path holding the module `mykern`, importable here and by a reproducer run there."""
    (tmp_path / "mykern.py").write_text(KERNELS)
    monkeypatch.syspath_prepend(str(OUTSIDE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("mykern", None)


def run_reproducer(cause, cwd, impl, status=1):
    """The stdout of the cause's reproducer, written under `cwd` and run there in a fresh process,
    which exits `status`: 1 while the case fails (so `git bisect run` can use it), 0 once it passes."""
    path = triage.write_reproducers([cause], cwd / "out", impl=impl, declare=None, size="tiny", device="cpu")[cause.signature]
    assert path == cwd / "out" / "repro" / "cause-1.py"
    assert len(path.read_text().splitlines()) <= 35
    env = {**os.environ, "PYTHONPATH": str(OUTSIDE), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, str(path)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == status, out.stdout + out.stderr
    return out.stdout


def test_a_reproducer_reruns_a_real_failure(kernels):
    """The smallest of a wrong kernel's parity failures, rerun by its script in a fresh process."""
    impl = load_user_impl("mykern:off_by_a_little")
    family = FAMILIES["parity"]
    failures = []
    for case in (fit(c, impl) for c in select("tiny")):
        if family.applies(case) and not family.skip(impl, case, "cpu") and case.pattern == "mixed":
            try:
                family.check(impl, case, "cpu")
            except ConformanceFailure as e:
                failures.append(result("parity", case.id, f"{FAILURE}{e}", impl=impl.name))
    (cause,) = triage.group(failures)
    assert cause.signature.startswith("o: max abs err") and cause.count == len(failures) > 1
    stdout = run_reproducer(cause, kernels, impl.name)
    case_id = cause.smallest.nodeid.split(f"{impl.name}-")[1].rstrip("]")
    assert "o: max abs err" in stdout and "NaN in o: 0, in the reference: 0" in stdout
    assert f"parity FAILED: [{case_id}] o: max abs err" in stdout, stdout


def test_a_reproducer_reruns_a_bad_input_failure(kernels):
    impl = load_user_impl("mykern:lax")
    bad, case = triage.find_bad_input(impl, "q-rank")
    with pytest.raises(ConformanceFailure) as e:
        check_bad_input(impl, bad, case, "cpu")
    (cause,) = triage.group([result("bad_input", "q-rank", f"{FAILURE}{e.value}", impl=impl.name)])
    assert cause.signature == "bad input q-rank: accepted silently" and cause.dtypes == ("fp32",)
    stdout = run_reproducer(cause, kernels, impl.name)
    assert f"bad_input FAILED: [{case.id}] bad input q-rank: accepted silently" in stdout, stdout


def test_a_varlen_reproducer_calls_the_varlen_entry(tmp_path):
    """A varlen case through `forward_varlen` and the reference on global ranges (here of a
    correct implementation, so the family's check passes)."""
    case = next(c for c in select("tiny") if c.mode == "varlen" and c.dtype == torch.float32)
    (cause,) = triage.group([result("varlen", case.id, "TypeError: flaky")])
    stdout = run_reproducer(cause, tmp_path, "reference", status=0)
    assert "o: max abs err 0.000e+00" in stdout and "varlen: passed on this case" in stdout, stdout


def test_write_reproducers_numbers_the_causes_and_skips_what_is_no_case(tmp_path):
    cid = CASES[0].id
    collection_error = CaseResult("check", "conformance/test_conformance.py", "parity", "error", "ImportError: no module x")
    causes = triage.group(
        [
            result("parity", cid, over(cid, "o", 1e-3)),
            result("backward", cid, over(cid, "o", 1e-3)),
            collection_error,
            result(
                "determinism", cid, differ(cid, "o", "run 2 vs run 1 must be bitwise identical"), test="test_determinism_backward"
            ),
        ]
    )
    assert [c.count for c in causes] == [2, 1, 1] and causes[1].smallest is collection_error
    (tmp_path / "repro").mkdir()
    (tmp_path / "repro" / "cause-9.py").write_text("stale")
    paths = triage.write_reproducers(causes, tmp_path, impl=IMPL, declare=None, size="small", device="cpu")
    assert paths == {c.signature: tmp_path / "repro" / f"cause-{n}.py" for n, c in ((1, causes[0]), (3, causes[2]))}
    assert sorted(p.name for p in (tmp_path / "repro").iterdir()) == ["cause-1.py", "cause-3.py"]
    text = paths["o: not bitwise identical across runs"].read_text()
    assert "FAMILIES['determinism_backward'].check(impl, case, DEVICE)" in text and f"find_case(impl, {cid!r}, 'small')" in text
    compile(text, "cause-3.py", "exec")
    with pytest.raises(ValueError, match="not a case of the matrix"):
        triage.reproducer(causes[1], impl=IMPL, declare=None, size="tiny", device="cpu")
    lines = triage.render(causes, paths)
    assert "   - reproduce: `python " + str(paths[causes[0].signature]) + "`" in lines
    assert "   - no reproducer: not a case of the matrix" in lines


def test_find_case_names_what_it_cannot_find():
    impl = REGISTRY["sdpa"]
    case = fit(CASES[0], impl)
    assert triage.find_case(impl, case.id, "small") == case
    with pytest.raises(LookupError, match="no case prefill-nope"):
        triage.find_case(impl, "prefill-nope", "tiny")


def test_nan_where_o_must_be_zero_is_one_cause_however_a_family_words_it():
    """The reference's o is exactly 0 only on a row that selects nothing: a NaN there is the
    empty-row cause whether the row is the case's own, the empty_ranges family's or the bounds
    family's tail query, and a decode-row suffix does not split it; a NaN on a row with a finite
    non-zero reference stays its own cause."""
    cid = CASES[0].id
    sigs = {
        triage.signature(result("parity", cid, nonfinite(cid, "o", ref="0.0"))),
        triage.signature(result("empty_ranges", cid, differ(cid, "o[empty rows]", "an empty row gives o = 0 exactly"))),
        triage.signature(result("bounds", cid, differ(cid, "o[tail queries]", "they select nothing"))),
        triage.signature(result("decode", cid, nonfinite(f"{cid} decode of row 0 vs golden row", "o", ref="0.0"))),
    }
    assert sigs == {"o: NaN on rows that select nothing (where o is exactly 0)"}
    assert triage.signature(result("parity", cid, nonfinite(cid, "o", ref="0.5"))) == "o: NaN where the reference is finite"
