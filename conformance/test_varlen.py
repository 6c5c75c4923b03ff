"""Family varlen: Packed sequences (cu_seqlens) give what each sequence gives on its own."""

import pytest

from selgate.conformance.families import check_varlen

pytestmark = [pytest.mark.conformance, pytest.mark.varlen]


def test_varlen(impl, case, device):
    check_varlen(impl, case, device)
