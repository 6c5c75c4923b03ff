"""Family empty_ranges: rows selecting nothing give o = 0 exactly, lse = -inf, no NaN, zero dq."""

import pytest

from selgate.conformance.families import check_empty_ranges

pytestmark = [pytest.mark.conformance, pytest.mark.empty_ranges]


def test_empty_ranges(impl, case, device):
    check_empty_ranges(impl, case, device)
