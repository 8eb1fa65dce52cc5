"""eas_wire/placed.py: the relayed placements' wire shape, read in an announcement's ``blocks`` and a score
body's ``placed``, each bad value costing only itself."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from eas_wire.announce import Announcement, batch_json, parse_batch
from eas_wire.placed import (
    MAX_BLOCKS,
    MAX_PLACED,
    PlacedError,
    Placement,
    blocks_from_json,
    first_unsent,
    placed_from_json,
)
from eas_wire.scorebody import IUScore, ScoreBody

pytestmark = pytest.mark.unit

NOW = 1_764_780_000.0
IUS = {"n1-iu0", "n1-iu1"}
BLOCKS = ((8, 11), (16, 22), (37, 2**64 - 1))


def test_blocks_round_trip_through_an_announce_batch():
    raw = json.loads(batch_json("edge-a.3f9c2b1d", [Announcement("n1-iu0", 600, 1, NOW, BLOCKS),
                                                    Announcement("n1-iu1", 90, 2, NOW)]))
    assert "blocks" not in raw["announcements"][1]  # none: the batch stays as small as before
    edge, kept, ignored = parse_batch(raw, IUS, NOW)
    assert edge == "edge-a.3f9c2b1d" and not ignored
    assert kept == [Announcement("n1-iu0", 600, 1, NOW, BLOCKS), Announcement("n1-iu1", 90, 2, NOW)]


@pytest.mark.parametrize("blocks, message", [
    ("8,11", "is not a list"),
    ([[8, 11]] * (MAX_BLOCKS + 1), f"more than {MAX_BLOCKS}"),
    ([[8]], "is not [depth, hash]"),
    ([[8, "11"]], "is not [depth, hash]"),
    ([[8, True]], "is not [depth, hash]"),
    ([[0, 11]], "is not increasing"),
    ([[16, 11], [8, 12]], "is not increasing"),
    ([[2049, 11]], "is not increasing within 1..2048"),
    ([[8, -1]], "is not in [0, 2**64)"),
    ([[8, 2**64]], "is not in [0, 2**64)"),
])
def test_bad_blocks_are_refused_naming_the_value(blocks, message):
    with pytest.raises(PlacedError, match=re.escape(message)):
        blocks_from_json(blocks)


def test_an_announcement_with_bad_blocks_is_kept_without_them():
    raw = {"edge": "edge-a.3f9c2b1d", "announcements": [
        {"iu": "n1-iu0", "tokens": 600, "seq": 1, "sent": NOW, "blocks": [[8, -1]]}]}
    _, kept, ignored = parse_batch(raw, IUS, NOW)
    assert kept == [Announcement("n1-iu0", 600, 1, NOW)] and ignored == Counter(blocks_invalid=1)


def body(placed) -> dict:
    return {"node": "n1", "ts": NOW, "ius": {iu: {"score": 0.1, "status": "passing", "reason": ""} for iu in IUS},
            "placed": placed}


def test_a_body_carries_its_placements_and_reads_them_back():
    typed = ScoreBody("n1", NOW, {"n1-iu0": IUScore(0.1, "passing", "")},
                      placed=(Placement(4, "n1-iu0", BLOCKS), Placement(5, "n1-iu0", ((8, 3),))))
    back, problems = ScoreBody.from_json(json.loads(typed.dumps()))
    assert back.placed == typed.placed and not problems
    assert "placed" not in ScoreBody("n1", NOW, {}).to_json()  # the KV's body never carries any


def test_a_body_drops_placements_for_other_ius_or_malformed_and_keeps_the_rest():
    counts = Counter()
    placed = [{"seq": 1, "iu": "n2-iu0", "blocks": [[8, 1]]},  # another node's IU: a node speaks for its own
              {"seq": 2, "iu": "n1-iu0", "blocks": [[8, 1]]},
              {"seq": 2, "iu": "n1-iu1", "blocks": [[8, 1]]},  # not increasing
              {"seq": 3, "iu": "n1-iu1", "blocks": "x"},
              "x",
              {"seq": 4, "iu": "n1-iu1", "blocks": [[8, 1], [16, 2]]}]
    typed, problems = ScoreBody.from_json(body(placed), counts=counts)
    assert typed.placed == (Placement(2, "n1-iu0", ((8, 1),)), Placement(4, "n1-iu1", ((8, 1), (16, 2))))
    assert counts["placed_invalid"] == 4 and not problems and set(typed.ius) == IUS


def test_a_placed_value_that_is_no_list_costs_only_the_relay():
    counts = Counter()
    typed, problems = ScoreBody.from_json(body([{"seq": 1, "iu": "n1-iu0", "blocks": []}] * (MAX_PLACED + 1)),
                                          counts=counts)
    assert typed.placed == () and set(typed.ius) == IUS and counts["placed_invalid"] == 1
    assert any(f"more than {MAX_PLACED}" in p for p in problems)
    assert placed_from_json([], IUS, 10) == ((), 0)


def test_a_reader_skips_the_placements_it_holds_unless_the_agent_restarted():
    placed = [{"seq": s, "iu": "n1-iu0", "blocks": [[8, s]]} for s in (3, 4, 5)]
    placed[0]["blocks"] = "never read"  # held already: skipped unread, not counted
    counts = Counter()
    typed, _ = ScoreBody.from_json(body(placed), counts=counts, placed_after=3)
    assert [p.seq for p in typed.placed] == [4, 5] and not counts
    restarted = [{"seq": s, "iu": "n1-iu0", "blocks": [[8, s]]} for s in (1, 2)]  # numbered from 1 again
    assert [p.seq for p in ScoreBody.from_json(body(restarted), placed_after=5)[0].placed] == [1, 2]
    assert placed_from_json(placed[1:], IUS, 10, after=5) == ((), 0)  # all held


def test_first_unsent_is_where_the_placements_after_the_last_written_one_start():
    placed = tuple(Placement(seq, "n1-iu0", BLOCKS) for seq in (4, 5, 7))
    assert [first_unsent(placed, sent) for sent in (0, 3, 4, 5, 6, 7, 9)] == [0, 0, 1, 2, 2, 3, 3]
    assert first_unsent((), 5) == 0
