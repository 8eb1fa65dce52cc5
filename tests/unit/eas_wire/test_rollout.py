"""The rollout document's strict parser, the per-request share, and the placement of sessions and of requests
without a session key: a keyed hash of the key against the weight."""

from __future__ import annotations

import json
import math
import random

import pytest

from eas_wire.rollout import (
    CanaryCounter,
    RolloutError,
    body_digest,
    loads,
    parse,
    request_digest,
    session_digest,
    session_on_canary,
    session_point,
)

pytestmark = pytest.mark.unit


def document(**changes) -> dict:
    doc = {"version": 1, "name": "r", "stable": "vllm-0.6+m", "canary": "vllm-0.7+m", "weight": 0.05,
           "state": "progressing", "step": 0, "updated": 1767225600.0, "reason": "",
           "history": [{"ts": 1767225600.0, "event": "start", "weight": 0.05, "reason": "", "evidence": {}}]}
    doc.update(changes)
    return doc


def test_a_document_round_trips():
    doc = parse(document())
    assert (doc.stable, doc.canary, doc.weight, doc.state, doc.effective_weight) == ("vllm-0.6+m", "vllm-0.7+m", 0.05,
                                                                                     "progressing", 0.05)
    assert loads(doc.dumps()) == doc
    planned = parse(document(steps=[[0.05, 172800], [1, 0]]))
    assert planned.steps == ((0.05, 172800.0), (1.0, 0.0)) and loads(planned.dumps()) == planned


@pytest.mark.parametrize(("changes", "field", "value"), [
    ({"weight": 1.5}, "weight", "1.5"),
    ({"weight": "0.5"}, "weight", "'0.5'"),
    ({"weight": float("nan")}, "weight", "nan"),
    ({"state": "rolling"}, "state", "'rolling'"),
    ({"canary": "vllm-0.6+m"}, "canary", "'vllm-0.6+m'"),
    ({"stable": "has space"}, "stable", "'has space'"),
    ({"version": 2}, "version", "2"),
    ({"state": "aborted", "weight": 0.2}, "weight", "0.2"),
    ({"state": "promoted", "weight": 0.5}, "weight", "0.5"),
    ({"step": -1}, "step", "-1"),
    ({"history": [{"ts": 1.0, "event": "x", "weight": 2}]}, "history[0].weight", "2"),
    ({"history": "none"}, "history", "'none'"),
    ({"steps": [[0.05, 3600], [1.5, 0]]}, "steps[1].weight", "1.5"),
    ({"steps": [[0.05]]}, "steps[0]", "[0.05]"),
    ({"session_salt": "ABCDEF0123456789abcdef0123456789"}, "session_salt", "'ABCDEF0123456789abcdef0123456789'"),
    ({"session_salt": "00" * 15}, "session_salt", "'" + "00" * 15 + "'"),
    ({"session_salt": 7}, "session_salt", "7"),
])
def test_a_bad_field_is_one_error_naming_it_and_its_value(changes, field, value):
    with pytest.raises(RolloutError) as caught:
        parse(document(**changes))
    assert caught.value.field == field
    assert str(caught.value).startswith(f"rollout document: {field} = {value}")


def test_text_that_is_no_json_or_no_object_is_refused():
    with pytest.raises(RolloutError, match="not JSON"):
        loads("{")
    with pytest.raises(RolloutError, match="not a JSON object"):
        loads(json.dumps([1]))


def test_aborted_sends_nothing_to_the_canary_and_promoted_everything():
    assert parse(document(state="aborted", weight=0)).effective_weight == 0
    assert parse(document(state="promoted", weight=1)).effective_weight == 1


@pytest.mark.parametrize("weight", [0.05, 0.2, 0.5, 0.01, 1 / 3, 0.999])
def test_the_counter_gives_the_weight_within_one_request_at_every_moment(weight):
    counter, canary = CanaryCounter(), 0
    for n in range(1, 20001):
        canary += counter.take(weight)
        assert abs(canary - n * weight) < 1.0 + 1e-9, n


def test_the_counter_is_tighter_than_random_draws():
    """At 5% over 2,000 requests the counter is off by < 1 request; random draws stray by ~10 (one sigma)."""
    counter, rng = CanaryCounter(), random.Random(1)
    counted = sum(counter.take(0.05) for _ in range(2000))
    drawn = [sum(rng.random() < 0.05 for _ in range(2000)) for _ in range(50)]
    assert abs(counted - 100) <= 1
    assert sum(abs(d - 100) > 1 for d in drawn) > 40


def test_a_weight_change_brings_no_burst():
    counter = CanaryCounter()
    for _ in range(999):
        counter.take(0.05)
    after = [counter.take(0.5) for _ in range(10)]
    assert 4 <= sum(after) <= 6
    assert [counter.take(0.0) for _ in range(5)] == [False] * 5
    assert [counter.take(1.0) for _ in range(5)] == [True] * 5


SALT = "0123456789abcdef0123456789abcdef"
SESSIONS = [session_digest(f"conversation-{n}".encode()) for n in range(20000)]


def points(salt: str = SALT) -> list[float]:
    key = parse(document(session_salt=salt)).session_key()
    return [session_point(key, s) for s in SESSIONS]


def test_the_salt_round_trips_and_without_one_the_key_is_the_rollouts_own():
    salted = parse(document(session_salt=SALT))
    assert loads(salted.dumps()) == salted and salted.session_key() == bytes.fromhex(SALT)
    plain = parse(document())
    assert "session_salt" not in plain.to_json()  # an edge that predates the field reads the same document
    assert plain.session_key() == parse(document(weight=0.5, step=1)).session_key()  # steps keep the key
    assert plain.session_key() != parse(document(name="r2")).session_key()  # the next rollout draws again


@pytest.mark.parametrize("weight", [0.01, 0.05, 0.2, 0.5, 0.999])
@pytest.mark.parametrize("salt", [SALT, "f" * 32, "00" * 16])
def test_the_canary_share_of_sessions_is_the_weight_within_four_sigma(weight, salt):
    """The stated tolerance: 4 * sqrt(w (1 - w) / n) over n sessions (20,000: 0.0014 at 1%, 0.014 at 50%)."""
    share = sum(session_on_canary(p, weight) for p in points(salt)) / len(SESSIONS)
    assert abs(share - weight) <= 4 * math.sqrt(weight * (1 - weight) / len(SESSIONS))


def test_every_turn_of_a_session_lands_on_one_side_at_a_fixed_weight():
    key = parse(document(session_salt=SALT)).session_key()
    for n in range(200):
        turns = {session_on_canary(session_point(key, session_digest(f"conversation-{n}".encode())), 0.2)
                 for _ in range(5)}
        assert len(turns) == 1


def test_as_the_weight_rises_no_session_leaves_the_canary_and_at_zero_every_session_is_on_stable():
    placed = points()
    weights = (0.05, 0.2, 0.5, 1.0)
    on_canary = [{n for n, p in enumerate(placed) if session_on_canary(p, w)} for w in weights]
    for lower, higher in zip(on_canary, on_canary[1:], strict=False):
        assert lower <= higher and len(higher) > len(lower)
    assert len(on_canary[-1]) == len(SESSIONS)  # promoted: every point is below 1
    assert not any(session_on_canary(p, 0.0) for p in placed)  # aborted
    assert all(0.0 <= p < 1.0 for p in placed)


def test_another_rollout_puts_other_sessions_first_on_the_canary():
    first, second = points(SALT), points("f" * 32)
    early = [{n for n, p in enumerate(ps) if p < 0.05} for ps in (first, second)]
    assert len(early[0] & early[1]) < 0.15 * len(early[0])  # about 5% overlap: independent draws


def test_any_key_hashes_and_the_key_is_not_kept():
    huge, raw = b"x" * (1 << 20), bytes(range(256)) * 4  # a megabyte; every byte value, not UTF-8
    for key in (huge, raw, "\ud800\udfff".encode("utf-8", "surrogatepass"), b"\x00"):
        digest = session_digest(key)
        assert len(digest) == 32 and key not in digest and 0.0 <= session_point(b"k" * 32, digest) < 1.0


BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_a_request_key_is_the_same_for_every_attempt_and_changes_with_any_of_its_fields():
    first = request_digest(b"Bearer sk-a", "/v1/chat/completions", body_digest(BODY))
    assert request_digest(b"Bearer sk-a", "/v1/chat/completions", body_digest(BODY)) == first  # the retry
    others = {request_digest(b"Bearer sk-b", "/v1/chat/completions", body_digest(BODY)),
              request_digest(b"Bearer sk-a", "/v1/completions", body_digest(BODY)),
              request_digest(b"Bearer sk-a", "/v1/chat/completions", body_digest(BODY + b" ")),
              request_digest(b"Bearer sk-a", "/v1/chat/completions", body_digest(BODY), b"idem-1"),
              request_digest(b"", "/v1/chat/completions", body_digest(BODY))}
    assert first not in others and len(others) == 5
    # the fields are length-prefixed: moving bytes from one field to the next is another request
    assert request_digest(b"ab", "/c", b"x") != request_digest(b"a", "b/c", b"x")


def test_no_session_key_and_no_idempotency_key_stands_in_for_a_request_key():
    """A client's X-Session-Id, user or Idempotency-Key hashes apart from every request key: it cannot take the
    place of the digest of another client's request, even with the very bytes that request's key hashes."""
    digest = body_digest(BODY)
    target = request_digest(b"Bearer sk-victim", "/v1/completions", digest)
    fields = b"Bearer sk-victim" + b"/v1/completions" + digest
    assert target not in {session_digest(fields), session_digest(digest), session_digest(target)}
    assert target != request_digest(b"Bearer sk-victim", "/v1/completions", b"", digest)  # as an Idempotency-Key
    assert request_digest(b"k", "/p", body_digest(b"{}")) != request_digest(b"k", "/p", b"", body_digest(b"{}"))


@pytest.mark.parametrize("weight", [0.01, 0.05, 0.2, 0.5])
def test_the_canary_share_of_distinct_requests_without_a_session_key_is_the_weight_within_four_sigma(weight):
    """20,000 distinct prompts from 50 clients: 4 sigma is 0.0062 at 5%, 0.014 at 50%."""
    key = parse(document(session_salt=SALT)).session_key()
    placed = [session_point(key, request_digest(f"Bearer sk-{n % 50}".encode(), "/v1/completions",
                                                body_digest(f'{{"prompt": "question {n}"}}'.encode())))
              for n in range(20000)]
    share = sum(session_on_canary(p, weight) for p in placed) / len(placed)
    assert abs(share - weight) <= 4 * math.sqrt(weight * (1 - weight) / len(placed))


def test_no_request_has_a_side_without_the_salt():
    """A client cannot pick a body, credential or Idempotency-Key that is on the canary: under 2,000 salts one
    fixed request is on the canary at 5% for about 5% of them, as any other request is."""
    digest = request_digest(b"Bearer sk-a", "/v1/completions", body_digest(BODY))
    rng = random.Random(7)
    on_canary = sum(session_on_canary(session_point(rng.randbytes(16), digest), 0.05) for _ in range(2000))
    assert abs(on_canary / 2000 - 0.05) <= 4 * math.sqrt(0.05 * 0.95 / 2000)
