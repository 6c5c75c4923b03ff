"""Family group: equal q across the heads of a group gives bitwise-equal outputs."""

import pytest

from selgate.conformance.families import check_group

pytestmark = [pytest.mark.conformance, pytest.mark.group]


def test_group(impl, case, device):
    check_group(impl, case, device)
