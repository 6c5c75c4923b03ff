"""The conformance matrix as a pytest plugin (entry point `pytest11`, so an installed
selgate brings it to any pytest run): the `--impl`, `--size` and `--declare` options, the
family markers, and the parametrization of each family's test over (implementation x case),
OpInfo style. Every declared combination runs, an undeclared one is a skip with its
reason, a declared known bug is `xfail(strict=True)`. Markers, tests and their parameters
come from the family declarations (selgate.conformance.families: `Family.params`).

    pytest --pyargs selgate.conformance -m conformance --impl mypkg.mod:fn [--declare fn.yaml]
"""

from __future__ import annotations

import pytest
import torch

# the families' own tests (policy's) use plain asserts: rewritten, as in a test module
pytest.register_assert_rewrite("selgate.conformance.families")

from . import families  # noqa: E402
from .cases import SIZES, select  # noqa: E402
from .registry import resolve  # noqa: E402

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
    for name, what in families.reported().items():
        config.addinivalue_line("markers", f"{name}: conformance family: {what}")
    try:
        config._selgate_impls = resolve(config.getoption("--impl"), declare=config.getoption("--declare"))
    except (ValueError, ImportError, AttributeError, TypeError, OSError) as e:
        raise pytest.UsageError(str(e)) from e


@pytest.fixture
def device():
    return DEVICE


def pytest_generate_tests(metafunc):
    if "impl" not in metafunc.fixturenames:
        return
    family = families.of_test(metafunc.function.__name__)
    if family is None:
        raise pytest.UsageError(f"{metafunc.function.__name__}: takes impl but is no conformance family's test")
    cases = select(metafunc.config.getoption("--size"))
    metafunc.parametrize(*family.params(metafunc.config._selgate_impls, cases, DEVICE))
