"""bench/rollout_sessions.py end to end: through three real eas-edge processes, conversations without a session
key flip-flop between the revisions (the baseline: each request drawn by the credit counter), and with one
(``X-Session-Id``, or the body's ``user``) every turn of a session stays on one revision at each weight, none
moves back to stable as the weight rises, the canary's share of sessions is the weight within 4 sigma,
nothing reaches the canary after the abort and no key appears in the edges' debug logs. A request retried
without a session key meets both revisions under the credit counter (the baseline) and one under its own
key.
The measured table is printed (``-s`` shows it; a failure shows it always)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import rollout_sessions  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_sessions_with_a_key_and_retried_requests_never_flip_flop_and_without_a_key_they_do():
    rows = [rollout_sessions.run_mode(mode, sessions=40, turns=3) for mode in rollout_sessions.MODES]
    print("\n" + rollout_sessions.table(rows))
    by_mode = {row["mode"]: row for row in rows}
    assert by_mode["none"]["flip_flop"] > 0.2  # the measurement sees flips where they happen
    assert all(by_mode["none"]["share_ok"].values())  # requests without a key: the counter's exact share
    assert by_mode["retry-counter"]["flip_flop"] > 0.2 and all(by_mode["retry-counter"]["share_ok"].values())
    retried = by_mode["retry"]
    assert (retried["flip_flop"], retried["canary_after_abort"], retried["keys_in_logs"]) == (0, 0, 0)
    assert retried["met"], retried
    for mode in ("header", "user"):
        row = by_mode[mode]
        assert (row["flip_flop"], row["moved_back"], row["canary_after_abort"], row["keys_in_logs"]) == (0, 0, 0, 0)
        assert row["met"], row
