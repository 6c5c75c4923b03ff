"""Family gradcheck: torch.autograd.gradcheck in fp64 on tiny cases."""

import pytest

from selgate.conformance.families import check_gradcheck

pytestmark = [pytest.mark.conformance, pytest.mark.gradcheck]


def test_gradcheck(impl, case, device):
    check_gradcheck(impl, case, device)
