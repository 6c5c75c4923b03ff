"""`selgate check`'s root causes: failures grouped by the SPEC.md rule, tensor and kind the
matrix records where it raises them (or by their message, for what it did not word), the
smallest case of each, a bounded report section, and reproducer scripts that run."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from selgate.conformance.cases import DTYPE_NAMES, select
from selgate.conformance.compare import ConformanceFailure, assert_close, assert_equal
from selgate.conformance.families import FAMILIES
from selgate.conformance.families.bad_input import check as check_bad_input
from selgate.conformance.families.limits import beyond, label
from selgate.conformance.families.limits import check as check_limits
from selgate.conformance.impl import fit
from selgate.conformance.registry import REGISTRY, load_user_impl
from selgate.reports import repro_case, triage
from selgate.reports.results import CaseResult

OUTSIDE = Path(__file__).parents[1] / "outside"
IMPL = "fla.ops-nsa:parallel_nsa-v2"  # ':', '.' and '-' in an implementation's name
FAILURE = "selgate.conformance.compare.ConformanceFailure: "
CASES = [c for c in select("small") if c.mode != "varlen" and c.dtype != torch.float64]


def raised(check) -> ConformanceFailure:
    with pytest.raises(ConformanceFailure) as e:
        check()
    return e.value


def result(family, case, failure, test=None, impl=IMPL, param=None):
    """A failure as `selgate check` reads it from JUnit: test `test` of the family's module on
    `case`, its message and the facts the matrix recorded (conformance/plugin.py); `failure`
    is a ConformanceFailure, or the text of an error the matrix did not word."""
    nodeid = f"test_{family}.py::{test or 'test_' + family}[{impl}-{param or case.id}]"
    facts = {"case": case.id, "dtype": DTYPE_NAMES[case.dtype], "elements": str(case.shape.elements)}
    if isinstance(failure, ConformanceFailure):
        return CaseResult("check", nodeid, family, "fail", f"{FAILURE}{failure}", facts=facts | {"failure": failure.facts})
    return CaseResult("check", nodeid, family, "fail", failure, facts=facts)


def over(case, name, err, where=0):
    """compare.assert_close's failure on fp32 values `err` off at one element (bound 1e-5)."""
    ref = torch.full((4, 3), 0.5, dtype=torch.float64)
    got = ref.float().clone()
    got.view(-1)[where] += err
    return raised(lambda: assert_close(name, got, ref, precision=torch.float32, case_id=case.id))


def differ(case, name, why, rule, got=math.nan, want=0.0, count=12):
    a = torch.full((count + 2,), want, dtype=torch.float32)
    a[:count] = got
    return raised(lambda: assert_equal(name, a, torch.full_like(a, want), case_id=case.id, why=why, rule=rule))


def nonfinite(case, name, got=math.nan, ref=0.5):
    r = torch.full((5,), ref, dtype=torch.float64)
    a = r.float().clone()
    a[2] = got
    return raised(lambda: assert_close(name, a, r, precision=torch.float32, case_id=case.id))


def misshapen(case, name, got_shape, want_shape):
    ref = torch.zeros(want_shape, dtype=torch.float64)
    return raised(lambda: assert_close(name, torch.zeros(got_shape), ref, precision=torch.float32, case_id=case.id))


def fla_like():
    """170 failures of a kernel like fla's: NaN in o on empty rows, TF32-size errors in fp32
    (o, dq, dk), NaN gradients of keys nothing selects, and a few non-repeatable backward runs."""
    fp32 = [c for c in CASES if c.dtype == torch.float32]
    empty = ("o[empty rows]", "an empty row gives o = 0 exactly", "empty-rows")
    out = [result("empty_ranges", c, differ(c, *empty)) for c in CASES[:60]]
    out += [result("parity", c, over(c, "o", 1.2e-3 + 1e-5 * i, where=i % 12)) for i, c in enumerate(fp32[:50])]
    out += [result("backward", c, over(c, "dq", 1.8e-3 - 1e-5 * i)) for i, c in enumerate(fp32[:20])]
    out += [result("backward", c, over(c, "dk", 1.5e-3)) for c in fp32[20:30]]
    tail = ("dk[tail keys]", "nothing selects them", "unselected-keys")
    out += [result("bounds", c, differ(c, *tail, count=i + 1)) for i, c in enumerate(fp32[:25])]
    out += [
        result(
            "determinism",
            c,
            differ(c, "dq", f"run {2 + i % 3} vs run 1 must be bitwise identical", "determinism", got=0.125, want=0.25),
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
        "o: max abs err 100-1000x over its bound": 50,
        "dk: NaN where 0 is expected": 25,
        "dq: max abs err 100-1000x over its bound": 20,
        "dk: max abs err 100-1000x over its bound": 10,
        "dq: not bitwise identical across runs": 5,
    }
    assert [c.count for c in causes] == sorted((c.count for c in causes), reverse=True)
    empty = causes[0]
    assert empty.families == ("empty_ranges",) and empty.dtypes == ("bf16", "fp16", "fp32") and empty.rule == "empty-rows"
    assert causes[1].families == ("parity",) and causes[1].dtypes == ("fp32",) and causes[1].rule == "accuracy"
    assert empty.example == empty.smallest.message and empty.smallest in failures


@pytest.mark.parametrize(
    "make",
    [
        lambda case, i: over(case, "o", 1.2e-3 * (1 + i / 10), where=i),
        lambda case, i: differ(case, "dk[tail keys]", "nothing selects them", "unselected-keys", count=3 + i),
        lambda case, i: nonfinite(case, "lse", got=[math.nan, -math.nan][i], ref=[0.5, -3.25][i]),
        lambda case, i: differ(case, "o", f"run {2 + i} vs run 1 must be bitwise", "determinism", got=0.1 * (i + 1), want=0.7),
        lambda case, i: misshapen(case, "o", (2 + i, 9, 16 + i), (2 + i, 9, 8 + i)),
        lambda case, i: (
            f"RuntimeError: shape '[{i + 2}, 9]' is invalid for input of size {1152 * (i + 1)} at 0x7f{i}a in /tmp/k{i}/x.py"
        ),
        lambda case, i: (
            f"worker 'gw{i}' crashed while running 'selgate/conformance/test_conformance.py::test_parity[{IMPL}-{case.id}]'"
        ),
        lambda case, i: f"Failed: Timeout >{300 + i}.0s",
    ],
)
def test_one_failure_on_two_cases_has_one_signature(make):
    a, b = CASES[0], CASES[-1]
    assert (a.id, a.seed, a.shape) != (b.id, b.seed, b.shape)
    ra, rb = result("parity", a, make(a, 0)), result("backward", b, make(b, 1))
    assert triage.key(ra) == triage.key(rb)
    sig_a, sig_b = triage.signature(ra), triage.signature(rb)
    assert sig_a == sig_b
    assert a.id not in sig_a and b.id not in sig_b and len(sig_a) <= triage.MAX_SIGNATURE
    (cause,) = triage.group([ra, rb])
    assert cause.count == 2


def test_different_failures_have_different_causes():
    case = CASES[0]

    def sig(failure):
        return triage.signature(result("parity", case, failure))

    assert sig(over(case, "o", 1e-3)) != sig(over(case, "dk", 1e-3))
    assert sig(nonfinite(case, "o")) != sig(over(case, "o", 1e-3))
    assert sig(nonfinite(case, "o", got=math.nan)) != sig(nonfinite(case, "o", got=math.inf))
    tails = [differ(case, f"{t}[tail keys]", "nothing selects them", "unselected-keys") for t in ("dk", "dv")]
    assert sig(tails[0]) != sig(tails[1])
    assert sig(over(case, "o", 2e-4)) == "o: max abs err 10-100x over its bound"
    assert sig(over(case, "o", 2e-2)) == "o: max abs err 1000-10^4x over its bound"
    assert sig(nonfinite(case, "o")) == "o: NaN where the reference is finite"


def test_kinds_of_failure_as_the_matrix_records_them():
    case = CASES[0]
    ones = torch.ones(3, 4, dtype=torch.float64)
    mean_over = ones.float() + 5e-6  # the max within its bound (1e-5), the mean 5x over (1e-6)
    across = "a second process's run vs this one's (not bitwise identical across processes)"
    cases = {
        misshapen(case, "o", (2, 9, 2, 4, 16), (2, 9, 2, 4, 8)): ("shapes", "o: shape differs in Dv"),
        misshapen(case, "lse", (2, 9, 2), (2, 9, 2, 4)): ("shapes", "lse: 3 dims, expected 4"),
        nonfinite(case, "lse", got=0.0, ref=-math.inf): ("empty-rows", "lse: 0 on rows that select nothing (where lse is -Inf)"),
        nonfinite(case, "lse", got=math.inf, ref=0.5): ("finite", "lse: Inf where the reference is finite"),
        nonfinite(case, "o", ref=0.0): ("empty-rows", "o: NaN on rows that select nothing (where o is exactly 0)"),
        raised(lambda: assert_close("o", mean_over, ones, precision=torch.float32, case_id=case.id)): (
            "accuracy",
            "o: mean abs err 1-10x over its bound",
        ),
        differ(case, "o", "int32 ranges vs int64 ranges", "ranges", got=0.5, want=0.25): (
            "ranges",
            "o: differs (int32 ranges vs int64 ranges)",
        ),
        differ(case, "lse[empty rows]", "an empty row gives lse = -inf", "empty-rows", got=0.5, want=-math.inf): (
            "empty-rows",
            "lse: non-zero on rows that select nothing (where lse is -Inf)",
        ),
        differ(case, "o", across, "determinism", got=0.5, want=0.25): (
            "determinism",
            "o: not bitwise identical across processes",
        ),
    }
    for failure, (rule, want) in cases.items():
        r = result("dtype", case, failure)
        assert (triage.key(r)[0], triage.signature(r)) == (rule, want), failure
    unworded = {
        "TypeError: an implementation declaring lse must return (o, lse), got Tensor": (
            "TypeError: an implementation declaring lse must return (o, lse), got Tensor"
        ),
        "[XPASS(strict)] NaN on empty rows": "a declared expected failure passed (XPASS strict)",
        f"worker 'gw0' crashed while running 'x'; then {FAILURE}[{case.id}] o: max abs err": (
            "worker crashed while running the case (an abort, segfault or kill, or past its time limit)"
        ),
    }
    for message, want in unworded.items():
        assert triage.key(result("dtype", case, message)) == (None, None, want), message


def test_one_bug_is_one_cause_however_far_over_its_bound():
    """A wrong scale is off by 10x on one case and 1000x on another: one cause, its title
    spanning the powers of ten between."""

    def causes(*errors):
        return {
            c.signature: c.count
            for c in triage.group([result("parity", CASES[i], over(CASES[i], "o", e)) for i, e in enumerate(errors)])
        }

    assert causes(9e-5, 1.1e-4, 2e-4) == {"o: max abs err 1-100x over its bound": 3}
    assert causes(2e-4, 3e-3, 4e-2, 5e-2) == {"o: max abs err 10-10^4x over its bound": 4}
    assert causes(2e-4, 2e-2) == {"o: max abs err 10-10^4x over its bound": 2}


def test_the_smallest_case_represents_its_cause():
    failures = [result("parity", c, over(c, "o", 1e-3)) for c in reversed(CASES)]
    (cause,) = triage.group(failures)
    assert cause.count == len(CASES)
    smallest = min(CASES, key=lambda c: (c.shape.elements, f"test_parity.py::test_parity[{IMPL}-{c.id}]"))
    assert cause.smallest.facts["case"] == smallest.id
    # equal size: the first nodeid
    case = CASES[0]
    (cause,) = triage.group([result("parity", case, over(case, "o", 1e-3)), result("group", case, over(case, "o", 1e-3))])
    assert cause.smallest.nodeid.startswith("test_group.py::") and cause.families == ("group", "parity")
    # a crashed worker's test has no facts: its id is read (varlen ones too); one with no case id comes last
    varlen = next(c for c in select("small") if c.mode == "varlen" and c.size == "tiny")
    bigger = next(c for c in CASES if c.size == "small")
    crash = CaseResult("check", "conformance/test_conformance.py", "parity", "error", "TypeError: x")
    bare = CaseResult("check", f"test_varlen.py::test_varlen[{IMPL}-{varlen.id}]", "varlen", "fail", "TypeError: x")
    (cause,) = triage.group([crash, result("parity", bigger, "TypeError: x"), bare])
    assert cause.smallest is bare and cause.dtypes == tuple(sorted({DTYPE_NAMES[varlen.dtype], DTYPE_NAMES[bigger.dtype]}))
    assert triage.case_of(bare) == (varlen.id, DTYPE_NAMES[varlen.dtype], varlen.shape.elements)


def test_the_report_section_stays_short_whatever_the_failure_count():
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"]
    failures = fla_like() * 20
    for i in range(5000 - len(failures)):
        c = CASES[i % len(CASES)]
        failures.append(result("parity", c, f"KeyError: no {words[i % 10]}{words[i // 10 % 10]} in table {i} " + "x" * 900))
    assert len(failures) == 5000
    causes = triage.group(failures)
    assert len(causes) == 6 + 100
    paths = {c.signature: Path(f"repro/cause-{n}.py") for n, c in enumerate(causes, 1)}
    lines = triage.render(causes, paths)
    assert len(lines) <= 7 + 5 * 8
    assert all(len(line) < 700 and "\n" not in line for line in lines)
    assert lines[0] == "## Root causes"
    rest = causes[8:]
    assert lines[-1] == f"And {len(rest)} more cause(s) covering {sum(c.count for c in rest)} failure(s): see junit.xml."
    assert "`python repro/cause-1.py`" in "\n".join(lines)
    assert "   - breaks SPEC.md, The function: a row that selects nothing gives o = 0 exactly, lse = -inf, no gradient" in lines
    assert triage.render([], {}) == []
    assert len(triage.render(causes[:2], {})) == 4 + 2 * 5


def test_bad_inputs_the_kernel_accepts_are_one_cause_pointing_at_check_inputs():
    """Missing input checks came out as one cause per bad input (ten for one omission): they
    are one cause, and the section says what fixes them at once."""
    case, names = CASES[0], ("q-rank", "k-dtype", "scale-nan")
    accepted = [
        ConformanceFailure(f"[{case.id}] bad input {n}: accepted silently", rule="bad-input", kind="accepted silently")
        for n in names
    ]
    causes = triage.group([result("bad_input", case, f, param=n) for n, f in zip(names, accepted)])
    lines = triage.render(causes, {})
    assert [(c.signature, c.count, c.rule) for c in causes] == [("bad input accepted silently", 3, "bad-input")]
    assert "3 of these failures are bad inputs" in lines[-1] and "check_inputs(" in lines[-1]
    assert not any("check_inputs" in line for line in lines[:-2])
    one = triage.group([result("bad_input", case, accepted[0], param=names[0])])
    assert not any("check_inputs" in line for line in triage.render(one, {}))


@pytest.mark.parametrize("name", ["scale-1-over-Dk", "empty-rows-lse-zero", "nan-on-empty-rows", "dense-dk"])
def test_a_known_bad_kernel_is_one_cause(name):
    """One bug, one cause, across the families that catch it: a wrong scale off by 10^4x on one
    case and 10^5x on another, lse = 0 on empty rows as parity and empty_ranges word it."""
    from selgate.conformance.badimpls import BAD_IMPLS

    impl = next(b.impl for b in BAD_IMPLS if b.impl.name == name)
    failures = []
    for family in (FAMILIES[f] for f in ("parity", "empty_ranges", "backward")):
        cases = [fit(c, impl) for c in select("tiny") if c.dtype == torch.float32]
        for case in [c for c in cases if family.applies(c) and not family.skip(impl, c, "cpu")][:8]:
            try:
                family.check(impl, case, "cpu")
            except ConformanceFailure as e:
                failures.append(result(family.name, case, e, impl=name))
    causes = triage.group(failures)
    assert len(failures) > 1 and len(causes) == 1, [(c.count, c.signature) for c in causes]


# --- reproducers ------------------------------------------------------------------------------

KERNELS = '''"""Kernels of an outside author for the reproducer tests: off by a little, one that
validates nothing, one that aborts its process and one that hangs."""
import os
import time

import torch
from tokenkernels import off_by_a_little  # noqa: F401


def lax(q, k, v, ranges, *, scale=None):
    return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=v.dtype)


def aborts(q, k, v, ranges, *, scale=None):
    os.abort()


def hangs(q, k, v, ranges, *, scale=None):
    time.sleep(3600)


lax.dtypes = aborts.dtypes = hangs.dtypes = ("fp32",)
'''


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    """tmp_path holding the module `mykern`, importable here and by a reproducer run there."""
    (tmp_path / "mykern.py").write_text(KERNELS)
    monkeypatch.syspath_prepend(str(OUTSIDE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("mykern", None)


def run_reproducer(cause, cwd, impl, status=1, run_in=None, limit_s=60):
    """The stdout of the cause's reproducer, written under `cwd` and run in a fresh process there
    (or in `run_in`), which exits `status`: 1 while the case fails, 0 once it passes, 125 when it
    cannot run (so `git bisect run` can use it)."""
    kw = dict(impl=impl, declare=None, size="tiny", device="cpu", limit_s=limit_s)
    path = triage.write_reproducers([cause], cwd / "out", **kw)[cause.signature]
    assert path == cwd / "out" / "repro" / "cause-1.py"
    assert len(path.read_text().splitlines()) <= 55  # short enough to read whole
    env = {**os.environ, "PYTHONPATH": str(OUTSIDE), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, str(path)], cwd=run_in or cwd, env=env, capture_output=True, text=True, timeout=120)
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
                failures.append(result("parity", case, e, impl=impl.name))
    (cause,) = triage.group(failures)
    assert cause.signature.startswith("o: max abs err") and cause.count == len(failures) > 1
    stdout = run_reproducer(cause, kernels, impl.name)
    case_id = cause.smallest.nodeid.split(f"{impl.name}-")[1].rstrip("]")
    assert "o: max abs err" in stdout and "NaN in o: 0, in the reference: 0" in stdout
    assert f"parity FAILED: [{case_id}] o: max abs err" in stdout, stdout
    # from another folder the kernel's module does not import: git bisect's "cannot test", not "bad"
    (kernels / "elsewhere").mkdir()
    stdout = run_reproducer(cause, kernels, impl.name, status=125, run_in=kernels / "elsewhere")
    assert "cannot run the case here: ModuleNotFoundError: " in stdout and "mykern" in stdout, stdout


@pytest.mark.parametrize(
    "kernel, message, limit_s, says",
    [
        ("aborts", "killed by SIGABRT during the call", 120, "FAILED: the case's process was killed by signal 6 (Aborted)"),
        ("hangs", "Failed: Timeout > 3.0s", 3, "FAILED: the case ran past 3 s (the check's --timeout)"),
    ],
)
def test_a_reproducer_fails_a_case_that_kills_its_process_or_hangs(kernels, kernel, message, limit_s, says):
    """Run in this process, an abort gave git bisect 134 (past 127 it stops) and a hang never
    ended. The limit counts from the child's start (a loaded machine took 3 s to import torch)."""
    case = next(c for c in select("tiny") if c.mode == "prefill" and c.dtype == torch.float32)
    (cause,) = triage.group([result("parity", case, message, impl=f"mykern:{kernel}")])
    stdout = run_reproducer(cause, kernels, f"mykern:{kernel}", limit_s=limit_s)
    assert says in stdout, stdout


def test_a_reproducer_reruns_a_limits_failure(kernels):
    """Beyond its declared dtypes (fp32 alone) the kernel answers zeros: the script reruns the
    limits family's fp16 case the matrix made."""
    impl = load_user_impl("mykern:lax")
    limit = "dtype fp16"
    case = beyond(impl, select("tiny"), "cpu")[limit, "full"]
    with pytest.raises(ConformanceFailure) as e:
        check_limits(impl, limit, case, "cpu")
    (cause,) = triage.group([result("limits", case, e.value, impl=impl.name, param=label(limit, case))])
    stdout = run_reproducer(cause, kernels, impl.name)
    assert f"limits FAILED: [{case.id}] beyond its declared dtype fp16: answered wrong instead of refusing" in stdout, stdout


def test_a_reproducer_reruns_a_bad_input_failure(kernels):
    impl = load_user_impl("mykern:lax")
    bad, case = repro_case.find_param(impl, "bad_input", f"{impl.name}-q-rank")
    with pytest.raises(ConformanceFailure) as e:
        check_bad_input(impl, bad, case, "cpu")
    (cause,) = triage.group([result("bad_input", case, e.value, impl=impl.name, param="q-rank")])
    assert cause.signature == "bad input accepted silently" and cause.dtypes == ("fp32",)
    stdout = run_reproducer(cause, kernels, impl.name)
    assert f"bad_input FAILED: [{case.id}] bad input q-rank: accepted silently" in stdout, stdout


def test_a_varlen_reproducer_calls_the_varlen_entry(tmp_path):
    """A varlen case through `forward_varlen` and the reference on global ranges (here of a
    correct implementation, so the family's check passes)."""
    case = next(c for c in select("tiny") if c.mode == "varlen" and c.dtype == torch.float32)
    (cause,) = triage.group([result("varlen", case, "TypeError: flaky")])
    stdout = run_reproducer(cause, tmp_path, "reference", status=0)
    assert "o: max abs err 0.000e+00" in stdout and "varlen: passed on this case" in stdout, stdout


def test_write_reproducers_numbers_the_causes_and_skips_what_is_no_case(tmp_path):
    case = CASES[0]
    cid = case.id
    collection_error = CaseResult("check", "conformance/test_conformance.py", "parity", "error", "ImportError: no module x")
    again = differ(case, "o", "run 2 vs run 1 must be bitwise identical", "determinism")
    causes = triage.group(
        [
            result("parity", case, over(case, "o", 1e-3)),
            result("backward", case, over(case, "o", 1e-3)),
            collection_error,
            result("determinism", case, again, test="test_determinism_backward"),
        ]
    )
    assert [c.count for c in causes] == [2, 1, 1] and causes[1].smallest is collection_error
    (tmp_path / "repro").mkdir()
    (tmp_path / "repro" / "cause-9.py").write_text("stale")
    paths = triage.write_reproducers(causes, tmp_path, impl=IMPL, declare=None, size="small", device="cpu", limit_s=60)
    assert paths == {c.signature: tmp_path / "repro" / f"cause-{n}.py" for n, c in ((1, causes[0]), (3, causes[2]))}
    assert sorted(p.name for p in (tmp_path / "repro").iterdir()) == ["cause-1.py", "cause-3.py"]
    text = paths["o: not bitwise identical across runs"].read_text()
    assert "FAMILIES['determinism_backward'].check(impl, case, DEVICE)" in text and f"find_case(impl, {cid!r}, 'small')" in text
    compile(text, "cause-3.py", "exec")
    with pytest.raises(ValueError, match="not a case of the matrix"):
        triage.reproducer(causes[1], impl=IMPL, declare=None, size="tiny", device="cpu", limit_s=60)
    lines = triage.render(causes, paths)
    assert "   - reproduce: `python " + str(paths[causes[0].signature]) + "`" in lines
    assert "   - no reproducer: not a case of the matrix" in lines


def test_find_case_names_what_it_cannot_find():
    impl = REGISTRY["sdpa"]
    case = fit(CASES[0], impl)
    assert repro_case.find_case(impl, case.id, "small") == case
    with pytest.raises(LookupError, match="no case prefill-nope"):
        repro_case.find_case(impl, "prefill-nope", "tiny")


def test_nan_where_o_must_be_zero_is_one_cause_however_a_family_words_it():
    """The reference's o is exactly 0 only on a row that selects nothing: a NaN there is the
    empty-row cause whether the row is the case's own, the empty_ranges family's or the bounds
    family's tail query, and a decode-row suffix does not split it; a NaN on a row with a finite
    non-zero reference stays its own cause."""
    case = CASES[0]
    failures = [
        result("parity", case, nonfinite(case, "o", ref=0.0)),
        result("empty_ranges", case, differ(case, "o[empty rows]", "an empty row gives o = 0 exactly", "empty-rows")),
        result("bounds", case, differ(case, "o[tail queries]", "they select nothing", "empty-rows")),
    ]
    (cause,) = triage.group(failures)
    assert (cause.signature, cause.count, cause.rule) == (
        "o: NaN on rows that select nothing (where o is exactly 0)",
        3,
        "empty-rows",
    )
    assert triage.signature(result("parity", case, nonfinite(case, "o", ref=0.5))) == "o: NaN where the reference is finite"
