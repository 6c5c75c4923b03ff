"""Family determinism: repeated runs are bitwise identical (SPEC.md, "Determinism")."""

import pytest

from selgate.conformance.families import check_determinism, check_determinism_backward

pytestmark = [pytest.mark.conformance, pytest.mark.determinism]


def test_determinism(impl, case, device):
    check_determinism(impl, case, device)


def test_determinism_backward(impl, case, device):
    check_determinism_backward(impl, case, device)
