"""bench/announce_cost.py end to end on a small pool: a real eas-edge process announces every request it routes
to the node agents' real POST /announce (token from a 0600 file), and with the channel off it announces none."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import announce_cost  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.mark.timeout(180)
def test_the_edge_announces_each_request_it_routes_only_when_the_channel_is_on():
    push, announce = announce_cost.run(nodes=3, rate=20.0, window=1.5)
    assert (push["mode"], announce["mode"]) == ("push", "announce")
    assert push["requests"] > 10 and announce["requests"] > 10 and push["errors"] == announce["errors"] == 0
    assert push["announced_per_request"] == 0.0 and push["batches_per_request"] == 0.0
    # every request announced and accepted by its node's agent (a 200 counting it), none dropped
    assert announce["announced_per_request"] == 1.0
    assert 0.5 <= announce["batches_per_request"] <= 1.0
