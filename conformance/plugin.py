"""The conformance matrix as a pytest plugin (entry point `pytest11`, so an installed
selgate brings it to any pytest run): the `--impl`, `--size` and `--declare` options, the
family markers, and the parametrization of each family's test over (implementation x case),
OpInfo style. Every declared combination runs, an undeclared one is a skip with its
reason, a declared known bug is `xfail(strict=True)`. A test `test_<family>(impl, case,
device)` gets the cases of FAMILIES[<family>], fitted to what the implementation declares
(heads per group, block size); `test_bad_input(impl, bad, case, device)` gets BAD_INPUTS.

    pytest --pyargs selgate.conformance -m conformance --impl mypkg.mod:fn [--declare fn.yaml]
"""

from __future__ import annotations

import pytest
import torch

from .cases import SIZES, select
from .registry import fit, known_bug, resolve, skip_reason

FAMILY_MARKERS = {
    "parity": "o and lse against the fp64 golden result",
    "backward": "dq, dk, dv against the golden gradients",
    "gradcheck": "torch.autograd.gradcheck in fp64",
    "determinism": "bitwise-identical repeated runs",
    "empty_ranges": "rows selecting nothing",
    "bounds": "NaN-poisoned keys outside the selection and beyond t",
    "dtype": "output dtypes, index dtypes, strided inputs",
    "decode": "decode equals the matching prefill row",
    "group": "equal q across a group's heads gives equal outputs",
    "varlen": "packed sequences equal per-sequence calls",
    "policy": "the dispatcher's ADR and fallback rules (selgate's own dispatcher)",
    "bad_input": "clear errors naming the argument",
}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def pytest_addoption(parser):
    group = parser.getgroup("selgate", "selgate conformance matrix")
    group.addoption(
        "--impl",
        default=None,
        metavar="NAMES|pkg.mod:fn",
        help="implementations to run the matrix on: comma-separated registered names "
        "(reference, sdpa, triton, triton-gather, triton-tma, triton-pairs, cuda) or package.module:callable; "
        "default: all registered",
    )
    group.addoption(
        "--size",
        default="tiny",
        choices=SIZES,
        help="largest case size class to run (cumulative: small also runs tiny); default tiny",
    )
    group.addoption(
        "--declare",
        default=None,
        metavar="FILE.yaml",
        help="declarations (capabilities, constraints, expected failures) of the one "
        "package.module:callable named by --impl, for a kernel whose module you do not own",
    )


def pytest_configure(config):
    """Registers the markers; a bad --impl or --declare is a usage error, reported once."""
    config.addinivalue_line("markers", "conformance: the conformance matrix; --impl and --size select what it runs")
    for name, what in FAMILY_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: conformance family: {what}")
    try:
        config._selgate_impls = resolve(config.getoption("--impl"), declare=config.getoption("--declare"))
    except (ValueError, ImportError, AttributeError, TypeError, OSError) as e:
        raise pytest.UsageError(str(e)) from e


@pytest.fixture
def device():
    return DEVICE


def _matrix(family, impls, cases):
    for impl in impls:
        for base in cases:
            if not family.applies(base):
                continue
            case = fit(base, impl)
            why = family.skip(impl, case, DEVICE)
            bug = None if why else known_bug(impl, family.name, case)
            marks = [pytest.mark.skip(reason=why)] if why else ([pytest.mark.xfail(strict=True, reason=bug)] if bug else [])
            yield pytest.param(impl, case, id=f"{impl.name}-{case.id}", marks=marks)


def _bad_inputs(impls, cases):
    """Each bad input once per implementation, on the first tiny case it supports."""
    from .families import BAD_INPUTS

    for impl in impls:
        for bad in BAD_INPUTS:
            usable = [
                c
                for c in (fit(c, impl) for c in cases)
                if c.size == "tiny"
                and (c.mode == "varlen") == bad.varlen
                and c.dtype in impl.dtypes
                and c.dtype != torch.float64
                and not skip_reason(impl, c, DEVICE)
            ]
            usable.sort(key=lambda c: c.dtype != torch.float32)
            why = skip_reason(impl, None, DEVICE, family="bad_input") or (
                None if usable else f"{impl.name} declares no tiny {'varlen' if bad.varlen else 'batched'} case"
            )
            bug = None if why or not usable else known_bug(impl, "bad_input", usable[0], bad.name)
            marks = [pytest.mark.skip(reason=why)] if why else ([pytest.mark.xfail(strict=True, reason=bug)] if bug else [])
            yield pytest.param(impl, bad, usable[0] if usable else None, id=f"{impl.name}-{bad.name}", marks=marks)


def pytest_generate_tests(metafunc):
    if "impl" not in metafunc.fixturenames:
        return
    from .families import FAMILIES

    name = metafunc.function.__name__.removeprefix("test_")
    impls = metafunc.config._selgate_impls
    cases = select(metafunc.config.getoption("--size"))
    if name == "bad_input":
        metafunc.parametrize(("impl", "bad", "case"), list(_bad_inputs(impls, cases)))
    else:
        metafunc.parametrize(("impl", "case"), list(_matrix(FAMILIES[name], impls, cases)))
