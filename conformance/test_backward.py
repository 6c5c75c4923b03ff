"""Family backward: dq, dk, dv equal the golden gradients; keys no row selected get exactly zero dk, dv."""

import pytest

from selgate.conformance.families import check_backward

pytestmark = [pytest.mark.conformance, pytest.mark.backward]


def test_backward(impl, case, device):
    check_backward(impl, case, device)
