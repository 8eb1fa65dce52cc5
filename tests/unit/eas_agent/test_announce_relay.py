"""eas_agent/announce.py's relay: the blocks of accepted announcements become numbered placements that the
node's /scores body carries for a bounded window; refused announcements, and the KV's body, carry none."""

from __future__ import annotations

import pytest

from eas_agent.announce import NodeAnnouncements
from eas_wire.announce import Announcement
from eas_wire.placed import MAX_PLACED, RELAY_WINDOW_S, Placement
from eas_wire.scorebody import IUScore, ScoreBody

pytestmark = pytest.mark.unit

NOW = 1_764_780_000.0
IUS = ("n1-iu0", "n1-iu1")
BLOCKS = ((8, 11), (13, 12))


def base(ts: float) -> ScoreBody:
    return ScoreBody("n1", ts, {iu: IUScore(0.1, "passing", "") for iu in IUS})


def test_accepted_blocks_are_relayed_numbered_and_only_for_the_window():
    node = NodeAnnouncements(IUS)
    node.receive("edge-a.1", [Announcement("n1-iu0", 500, 1, NOW, BLOCKS),
                              Announcement("n1-iu1", 90, 2, NOW)], NOW)  # no blocks: nothing to relay
    node.receive("edge-b.2", [Announcement("n1-iu1", 700, 1, NOW + 0.1, BLOCKS)], NOW + 0.1)
    node.receive("edge-a.1", [Announcement("n1-iu0", 500, 1, NOW + 0.1, BLOCKS)], NOW + 0.1)  # replayed: refused
    assert node.body(base(NOW + 0.05)).placed == (Placement(1, "n1-iu0", BLOCKS), Placement(2, "n1-iu1", BLOCKS))
    # once the window has passed the first placement has left it; every edge read it in the bodies before
    assert node.body(base(NOW + RELAY_WINDOW_S + 0.05)).placed == (Placement(2, "n1-iu1", BLOCKS),)
    assert base(NOW).placed == ()  # the body the Publisher writes to the KV carries none


def test_a_body_carries_at_most_the_newest_max_placed():
    node = NodeAnnouncements(IUS)
    node.receive("edge-a.1", [Announcement("n1-iu0", 10, s, NOW, BLOCKS) for s in range(1, MAX_PLACED + 11)], NOW)
    placed = node.body(base(NOW)).placed
    assert len(placed) == MAX_PLACED and placed[0].seq == 11 and placed[-1].seq == MAX_PLACED + 10
    assert len(ScoreBody.from_json(base(NOW).to_json() | {"placed": [p.to_json() for p in placed]})[0].placed) \
        == MAX_PLACED  # what the agent serves, every edge reads
