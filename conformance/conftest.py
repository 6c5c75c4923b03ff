"""Parametrizes each family's test over (implementation x case), OpInfo style: every
declared combination runs, an undeclared one is a skip with its reason, a declared known
bug is `xfail(strict=True)`. A test `test_<family>(impl, case, device)` gets the cases of
FAMILIES[<family>]; `test_bad_input(impl, bad, case, device)` gets BAD_INPUTS."""
import pytest
import torch

from selgate.conformance.cases import select
from selgate.conformance.families import BAD_INPUTS, FAMILIES
from selgate.conformance.registry import known_bug, resolve, skip_reason

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device():
    return DEVICE


def _matrix(family, impls, cases):
    for impl in impls:
        for case in cases:
            if not family.applies(case):
                continue
            why = family.skip(impl, case, DEVICE)
            bug = None if why else known_bug(impl, family.name, case)
            marks = [pytest.mark.skip(reason=why)] if why else (
                [pytest.mark.xfail(strict=True, reason=bug)] if bug else [])
            yield pytest.param(impl, case, id=f"{impl.name}-{case.id}", marks=marks)


def _bad_inputs(impls, cases):
    """Each bad input once per implementation, on the first tiny case it supports."""
    for impl in impls:
        for bad in BAD_INPUTS:
            usable = [c for c in cases if c.size == "tiny" and (c.mode == "varlen") == bad.varlen
                      and c.dtype == torch.float32 and not skip_reason(impl, c, DEVICE)]
            why = skip_reason(impl, None, DEVICE, family="bad_input") or (
                None if usable else f"{impl.name} declares no tiny fp32 {'varlen' if bad.varlen else 'batched'} case")
            marks = [pytest.mark.skip(reason=why)] if why else []
            yield pytest.param(impl, bad, usable[0] if usable else None, id=f"{impl.name}-{bad.name}", marks=marks)


def pytest_generate_tests(metafunc):
    if "impl" not in metafunc.fixturenames:
        return
    name = metafunc.function.__name__.removeprefix("test_")
    impls = resolve(metafunc.config.getoption("--impl"))  # validated by the root conftest
    cases = select(metafunc.config.getoption("--size"))
    if name == "bad_input":
        metafunc.parametrize(("impl", "bad", "case"), list(_bad_inputs(impls, cases)))
    else:
        metafunc.parametrize(("impl", "case"), list(_matrix(FAMILIES[name], impls, cases)))
