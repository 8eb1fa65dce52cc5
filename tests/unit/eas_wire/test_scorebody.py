"""The score body's wire form (scorebody.dumps): never NaN or Infinity, which no non-Python reader takes."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_strict_json_refuses_non_finite_numbers():
    """The backstop under the publisher's sanitising: scorebody.dumps (the KV body and /scores) raises
    instead of writing NaN/Infinity, which is invalid JSON for every non-Python reader."""
    from eas_agent import scorebody

    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValueError):
            scorebody.dumps({"score": bad})
    assert scorebody.dumps({"score": 0.5}) == '{"score":0.5}'
