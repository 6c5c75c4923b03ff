"""Family decode: decode of query `s` (keys cut at its position `t`) equals row `s` of prefill."""

import pytest

from selgate.conformance.families import check_decode

pytestmark = [pytest.mark.conformance, pytest.mark.decode]


def test_decode(impl, case, device):
    check_decode(impl, case, device)
