"""The edge's rollout split: which IUs a request may use, the share, sessions and retried requests kept on their
side, the last good document, the counts."""

from __future__ import annotations

import json

import pytest
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, generate_latest

from consul_io import layout
from eas_wire.rollout import body_digest, request_digest, session_digest, session_on_canary, session_point
from edge.body import summarize
from edge.pool import IUEntry
from edge.pool.view import Snapshot
from edge.rollout import RolloutFollower, placement_of, session_of

pytestmark = pytest.mark.unit
KEY = layout.rollout_key("dc1")


def entry(k: int, revision: str | None, health: str = "passing") -> IUEntry:
    return IUEntry(f"n{k}-iu0", f"n{k}", "r1", 0.1, "passing", "", 10.0, 2.0, health, revision=revision)


def snapshot(*entries: IUEntry) -> Snapshot:
    healthy = tuple(e for e in entries if e.routable)
    return Snapshot(tuple(entries), healthy, healthy, float("inf"), 0.0)


def kv(weight: float, state: str = "progressing", **changes) -> list[dict]:
    doc = {"version": 1, "name": "r", "stable": "old", "canary": "new", "weight": weight, "state": state,
           "step": 0, "updated": 1.0, "history": [], **changes}
    return [{"Key": KEY, "Value": json.dumps(doc)}]


POOL = snapshot(entry(1, "old"), entry(2, "old"), entry(3, None), entry(4, "new"), entry(5, "new"))
CANARY = frozenset({"n4-iu0", "n5-iu0"})
STABLE = frozenset({"n1-iu0", "n2-iu0", "n3-iu0"})


def test_without_a_document_every_iu_serves_every_request():
    follower = RolloutFollower()
    follower.apply_kv([])
    assert follower.split(POOL, frozenset({"x"})) == frozenset({"x"})


@pytest.mark.parametrize("weight", [0.05, 0.2, 0.5])
def test_the_canary_share_is_the_weight_and_each_request_is_on_one_side_only(weight):
    follower = RolloutFollower()
    follower.apply_kv(kv(weight))
    to_canary = 0
    for _ in range(4000):
        excluded = follower.split(POOL, frozenset())
        assert excluded in (STABLE, CANARY)  # a request never mixes revisions: its retry stays on its side
        to_canary += excluded == STABLE
    assert abs(to_canary - 4000 * weight) <= 1  # the stated tolerance: one request per edge


def test_an_iu_without_a_revision_is_on_the_stable_side():
    follower = RolloutFollower()
    follower.apply_kv(kv(0.5))
    assert follower.sides(POOL) == (CANARY, STABLE)


def test_abort_sends_everything_to_stable_and_promote_everything_to_the_canary():
    follower = RolloutFollower()
    follower.apply_kv(kv(0.0, "aborted"))
    assert {follower.split(POOL, frozenset()) for _ in range(50)} == {CANARY}
    follower.apply_kv(kv(1.0, "promoted"))
    assert {follower.split(POOL, frozenset()) for _ in range(50)} == {STABLE}


def test_a_bad_document_keeps_the_last_good_one_and_is_counted():
    registry = CollectorRegistry()
    follower = RolloutFollower(registry=registry)
    follower.apply_kv(kv(0.2))
    follower.apply_kv(kv(0.7, "aborted"))  # aborted with a weight: refused
    follower.apply_kv([{"Key": KEY, "Value": "{not json"}])
    assert follower.doc.weight == 0.2 and follower.read_errors == 2
    assert "weight = 0.7" in follower.last_error or "not JSON" in follower.last_error
    assert b"eas_edge_rollout_read_errors_total 2.0" in generate_latest(registry)


def test_a_side_with_no_routable_iu_for_the_request_is_not_imposed():
    follower = RolloutFollower()
    follower.apply_kv(kv(1.0, "promoted"))
    down = snapshot(entry(1, "old"), entry(4, "new", "critical"))
    assert follower.split(down, frozenset()) == frozenset()  # served by stable rather than refused
    assert follower.split(POOL, frozenset(CANARY)) == frozenset(CANARY)  # its model runs on no canary IU


def test_outcomes_are_counted_by_the_revision_of_the_iu_that_served():
    registry = CollectorRegistry()
    follower = RolloutFollower(registry=registry)
    follower.apply_kv(kv(0.5))
    follower.split(POOL, frozenset())
    follower.first_byte("n4-iu0", 0.3)
    follower.finished("n4-iu0", failed=False)
    follower.finished("n4-iu0", failed=False, status=500)
    follower.finished("n4-iu0", failed=False, status=404)  # the client's error, not the canary's
    follower.finished("n1-iu0", failed=True)
    text = generate_latest(registry).decode()
    assert 'eas_edge_rollout_requests_total{revision="new"} 3.0' in text
    assert 'eas_edge_rollout_errors_total{kind="status_5xx",revision="new"} 1.0' in text
    assert 'eas_edge_rollout_errors_total{kind="failed",revision="old"} 1.0' in text
    assert 'eas_edge_rollout_ttft_seconds_count{revision="new"} 1.0' in text
    assert 'eas_edge_rollout_unit_ttft_seconds_sum{iu="n4-iu0",revision="new"} 0.3' in text  # per IU: jitter
    assert "eas_edge_rollout_weight 0.5" in text


SALT = "00112233445566778899aabbccddeeff"
SESSIONS = [session_digest(f"chat-{n}".encode()) for n in range(2000)]


def sides_of(follower: RolloutFollower, sessions=SESSIONS) -> list[bool]:
    """Per session, whether its request went to the canary (the stable side's IUs excluded)."""
    return [follower.split(POOL, frozenset(), s) == STABLE for s in sessions]


def test_a_session_keeps_its_side_at_a_fixed_weight_and_every_edge_gives_it_the_same():
    edges = [RolloutFollower(), RolloutFollower()]
    for edge in edges:
        edge.apply_kv(kv(0.2, session_salt=SALT))
    turns = [sides_of(edges[turn % 2]) for turn in range(4)]  # four turns, alternating edges
    assert all(t == turns[0] for t in turns)
    key = edges[0].doc.session_key()
    assert turns[0] == [session_on_canary(session_point(key, s), 0.2) for s in SESSIONS]  # no per-edge state
    assert abs(sum(turns[0]) / len(SESSIONS) - 0.2) <= 4 * (0.2 * 0.8 / len(SESSIONS)) ** 0.5


def test_as_the_weight_rises_a_session_never_moves_back_to_stable_and_abort_takes_every_one_to_stable():
    follower, seen = RolloutFollower(), []
    for weight in (0.05, 0.2, 0.5):
        follower.apply_kv(kv(weight, session_salt=SALT, step=len(seen)))
        seen.append(sides_of(follower))
    for lower, higher in zip(seen, seen[1:], strict=False):
        assert all(h for low, h in zip(lower, higher, strict=True) if low)
    follower.apply_kv(kv(0.0, "aborted", session_salt=SALT))
    assert not any(sides_of(follower))
    follower.apply_kv(kv(1.0, "promoted", session_salt=SALT))
    assert all(sides_of(follower))


def test_keyed_requests_leave_the_counter_of_requests_without_a_key_alone():
    """A flood of sessions (hostile keys included) cannot steer the split of anyone else's requests."""
    quiet, flooded = RolloutFollower(), RolloutFollower()
    for follower in (quiet, flooded):
        follower.apply_kv(kv(0.2, session_salt=SALT))
    hostile = [session_of("\udcff" * 4000, None), session_of(None, session_digest(b"\xff\xfe" * 10000))]
    expected = [quiet.split(POOL, frozenset()) for _ in range(500)]
    got = []
    for _ in range(500):
        for key in hostile:
            flooded.split(POOL, frozenset(), key)
        got.append(flooded.split(POOL, frozenset()))
    assert got == expected and abs(sum(e == STABLE for e in got) - 100) <= 1


def test_the_header_comes_before_the_user_field_and_an_empty_one_is_no_key():
    user = summarize(json.dumps({"model": "m", "prompt": "p", "user": "alice"}).encode(), chat=False).user_session
    assert user == session_digest(b"alice")
    assert session_of("conv-1", user) == session_digest(b"conv-1")
    assert session_of("", user) == user and session_of(None, None) is None
    for absent in ("", 7, None, ["alice"]):  # only a non-empty string is a key (vLLM refuses a non-string)
        assert summarize(json.dumps({"user": absent}).encode(), chat=True).user_session is None
    # a lone surrogate from a JSON escape, and a header's bytes that are not UTF-8 (aiohttp: surrogateescape)
    assert summarize(b'{"user": "\\ud800"}', chat=False).user_session == session_digest(b"\xed\xa0\x80")
    assert session_of(b"\xff\xfe".decode("utf-8", "surrogateescape"), None) is not None


def test_choices_are_counted_by_how_they_were_made():
    registry = CollectorRegistry()
    follower = RolloutFollower(registry=registry)
    follower.apply_kv(kv(0.5))
    follower.split(POOL, frozenset(), SESSIONS[0])
    follower.split(POOL, frozenset())
    follower.split(POOL, frozenset())
    text = generate_latest(registry).decode()
    assert 'eas_edge_rollout_choices_total{by="session"} 1.0' in text
    assert 'eas_edge_rollout_choices_total{by="counter"} 2.0' in text


def test_a_session_whose_side_has_no_routable_iu_is_served_by_the_other_and_counted():
    registry = CollectorRegistry()
    follower = RolloutFollower(registry=registry)
    follower.apply_kv(kv(1.0, "promoted", session_salt=SALT))  # every session on the canary
    down = snapshot(entry(1, "old"), entry(4, "new", "critical"))
    assert follower.split(down, frozenset(), SESSIONS[0]) == frozenset()
    assert b"eas_edge_rollout_fallbacks_total 1.0" in generate_latest(registry)


def attempt(body: dict, retry: int, **headers: str) -> tuple[bytes | None, str]:
    """One attempt of a chat request as the OpenAI Python SDK sends it: the same body bytes on every attempt,
    ``x-stainless-retry-count`` raised on each retry (openai 3.63.0, ``_base_client._build_headers``)."""
    raw = json.dumps(body).encode()
    sent = CIMultiDict({"Authorization": "Bearer sk-eas-client-1", "x-stainless-retry-count": str(retry), **headers})
    summary = summarize(raw, chat=True)
    return placement_of(sent, "/v1/chat/completions", summary.user_session, summary.body_digest)


def chat(n: int) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": f"question {n}"}], "max_tokens": 8}


def test_a_retried_request_without_a_session_key_meets_the_same_revision_on_every_edge():
    edges = [RolloutFollower(), RolloutFollower(), RolloutFollower()]
    for edge in edges:
        edge.apply_kv(kv(0.2, session_salt=SALT))
    sides = [{edges[retry % 3].split(POOL, frozenset(), *attempt(chat(n), retry)) for retry in range(4)}
             for n in range(2000)]
    assert all(len(s) == 1 for s in sides)  # four attempts through three edges: one revision
    share = sum(s == {STABLE} for s in sides) / len(sides)
    assert abs(share - 0.2) <= 4 * (0.2 * 0.8 / len(sides)) ** 0.5


@pytest.mark.parametrize("weight", [0.05, 0.2, 0.5])
def test_distinct_sdk_requests_without_a_session_key_split_by_the_weight_within_four_sigma(weight):
    follower = RolloutFollower()
    follower.apply_kv(kv(weight, session_salt=SALT))
    to_canary = sum(follower.split(POOL, frozenset(), *attempt(chat(n), 0)) == STABLE for n in range(8000))
    assert abs(to_canary / 8000 - weight) <= 4 * (weight * (1 - weight) / 8000) ** 0.5


def test_a_session_key_comes_first_then_the_idempotency_key_then_the_body():
    body = chat(1)
    assert attempt(body, 0, **{"X-Session-Id": "conv-1"}) == (session_digest(b"conv-1"), "session")
    assert attempt({**body, "user": "alice"}, 0) == (session_digest(b"alice"), "session")
    by_body = request_digest(b"Bearer sk-eas-client-1", "/v1/chat/completions", body_digest(json.dumps(body).encode()))
    assert attempt(body, 0) == (by_body, "request")
    keyed = request_digest(b"Bearer sk-eas-client-1", "/v1/chat/completions", body_digest(json.dumps(body).encode()),
                           b"idem-7")
    assert attempt(body, 0, **{"Idempotency-Key": "idem-7"}) == (keyed, "request")
    assert attempt(chat(2), 3, **{"Idempotency-Key": "idem-7"}) == (keyed, "request")  # the client's key wins
    assert attempt(body, 0, **{"Idempotency-Key": ""}) == (by_body, "request")  # an empty one is none
    # rollout_request_key: never: the counter draws even for an SDK's request
    assert placement_of(CIMultiDict({"x-stainless-retry-count": "1"}), "/v1/completions", None,
                        body_digest(b"{}"), "never") == (None, "counter")


def test_only_a_request_that_says_it_may_be_retried_is_placed_by_its_own_key_unless_told_always():
    """Probes and load generators send one body over and over without either header: the counter spreads
    them by the weight, where a key would put every copy on one side."""
    digest = body_digest(b'{"prompt": "ping"}')
    plain = CIMultiDict({"Authorization": "Bearer sk-probe"})
    assert placement_of(plain, "/v1/completions", None, digest) == (None, "counter")
    assert placement_of(plain, "/v1/completions", None, digest, "always")[1] == "request"
    for signal in ({"X-Stainless-Retry-Count": "0"}, {"Idempotency-Key": "i-1"}):
        assert placement_of(CIMultiDict({**plain, **signal}), "/v1/completions", None, digest)[1] == "request"
    follower = RolloutFollower()
    follower.apply_kv(kv(0.2, session_salt=SALT))
    probes = [follower.split(POOL, frozenset(), *placement_of(plain, "/v1/completions", None, digest))
              for _ in range(1000)]
    assert sum(p == STABLE for p in probes) == 200  # the counter's exact share, copies or not


def test_nothing_else_a_client_sends_moves_its_request():
    """Retry counters, timeouts, request ids or headers that look like a choice are not part of the key."""
    body = chat(5)
    plain = attempt(body, 0)
    for noise in ({"x-stainless-read-timeout": "600"}, {"X-Request-Id": "r-1"}, {"X-Eas-Revision": "new"},
                  {"X-Canary": "always"}, {"X-Session-Affinity": "x"}, {"OpenAI-Organization": "org"}):
        assert attempt(body, 7, **noise) == plain, noise
    assert attempt(body, 0, Authorization="Bearer sk-eas-client-2") != plain  # another client falls apart


def test_requests_placed_by_their_own_key_leave_the_counter_alone_and_are_counted():
    registry = CollectorRegistry()
    follower, quiet = RolloutFollower(registry=registry), RolloutFollower()
    for edge in (follower, quiet):
        edge.apply_kv(kv(0.2, session_salt=SALT))
    got, expected = [], [quiet.split(POOL, frozenset()) for _ in range(100)]
    for n in range(100):
        follower.split(POOL, frozenset(), *attempt(chat(n), 0))
        got.append(follower.split(POOL, frozenset()))
    assert got == expected
    assert 'eas_edge_rollout_choices_total{by="request"} 100.0' in generate_latest(registry).decode()
