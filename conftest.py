"""Repository-wide pytest options of the conformance matrix (markers: pyproject.toml)."""
import pytest

from selgate.conformance.cases import SIZES
from selgate.conformance.registry import resolve


def pytest_addoption(parser):
    group = parser.getgroup("selgate", "selgate conformance matrix")
    group.addoption("--impl", default=None, metavar="NAMES|pkg.mod:fn",
                    help="implementations to run the matrix on: comma-separated registered names "
                         "(reference, sdpa, triton, cuda) or package.module:callable; default: all registered")
    group.addoption("--size", default="tiny", choices=SIZES,
                    help="largest case size class to run (cumulative: small also runs tiny); default tiny")


def pytest_configure(config):
    """A bad --impl is a usage error, reported once before collection."""
    try:
        resolve(config.getoption("--impl"))
    except (ValueError, ImportError, AttributeError, TypeError) as e:
        raise pytest.UsageError(str(e)) from e
