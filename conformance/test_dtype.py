"""Family dtype: output dtypes, shapes and device; int32 and int64 ranges agree bitwise; strided inputs work."""

import pytest

from selgate.conformance.families import check_dtype

pytestmark = [pytest.mark.conformance, pytest.mark.dtype]


def test_dtype(impl, case, device):
    check_dtype(impl, case, device)
