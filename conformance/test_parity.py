"""Family parity: o and lse equal the golden result; an implementation with an o-only path runs it too."""

import pytest

from selgate.conformance.families import check_parity

pytestmark = [pytest.mark.conformance, pytest.mark.parity]


def test_parity(impl, case, device):
    check_parity(impl, case, device)
