"""Family bad_input: malformed calls raise an error naming the argument, never a result."""

import pytest

from selgate.conformance.families import check_bad_input

pytestmark = [pytest.mark.conformance, pytest.mark.bad_input]


def test_bad_input(impl, bad, case, device):
    check_bad_input(impl, bad, case, device)
