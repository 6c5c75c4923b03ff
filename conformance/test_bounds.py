"""Family bounds: keys outside every selection and beyond `t` hold NaN, so any read of them shows."""

import pytest

from selgate.conformance.families import check_bounds

pytestmark = [pytest.mark.conformance, pytest.mark.bounds]


def test_bounds(impl, case, device):
    check_bounds(impl, case, device)
