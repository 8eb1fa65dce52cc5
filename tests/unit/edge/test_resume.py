"""What a stream cut mid-way has sent, and the request that continues it elsewhere."""

from __future__ import annotations

import json

import pytest

from edge.resume import StreamText, resumable

pytestmark = pytest.mark.unit


def event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def chat_delta(content: str | None = None, role: str | None = None, rid: str = "chatcmpl-a") -> bytes:
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return event({"id": rid, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})


def test_whole_events_only_reach_the_client_and_the_text_is_kept():
    text = StreamText({"prompt": "once", "max_tokens": 10}, chat=False)
    whole = event({"id": "cmpl-1", "choices": [{"index": 0, "text": " upon"}]})
    assert text.relay(whole + whole[:9]) == whole  # the half event waits
    assert text.relay(whole[9:]) == whole
    assert text.text == " upon upon" and text.id == "cmpl-1"
    body = text.continuation()
    # 2 events, 10 characters: 3 tokens at 4 characters each, the larger count
    assert body == {"prompt": "once upon upon", "max_tokens": 7}


def test_chat_continues_the_partial_assistant_message_and_the_splice_keeps_the_first_id():
    body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 50, "stream": True}
    text = StreamText(body, chat=True)
    text.relay(chat_delta(role="assistant", content="") + chat_delta("Hello") + chat_delta(" there"))
    continued = text.continuation()
    assert continued["messages"][-1] == {"role": "assistant", "content": "Hello there"}
    assert continued["continue_final_message"] is True and continued["add_generation_prompt"] is False
    assert continued["max_completion_tokens"] == 47  # 11 characters: 3 tokens at 4 characters each
    assert body["messages"] == [{"role": "user", "content": "hi"}]  # the client's body is not changed
    spliced = text.relay(chat_delta(role="assistant", content="", rid="chatcmpl-b") + chat_delta("!", rid="chatcmpl-b"),
                         splice=True)
    assert spliced == chat_delta("!", rid="chatcmpl-a")  # no second role event
    usage = event({"id": "chatcmpl-b", "choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 5,
                                                                "total_tokens": 25}})
    out = json.loads(text.relay(usage, splice=True)[6:])
    assert out["id"] == "chatcmpl-a" and out["usage"] == {"prompt_tokens": 17, "completion_tokens": 8,
                                                           "total_tokens": 25}


def test_a_client_continuing_its_own_assistant_message_gets_it_extended():
    body = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Dear"}],
            "continue_final_message": True, "add_generation_prompt": False}
    text = StreamText(body, chat=True)
    text.relay(chat_delta(" Sir"))
    assert text.continuation()["messages"][-1] == {"role": "assistant", "content": "Dear Sir"}


def test_what_cannot_be_resumed_from_its_text_is_not():
    assert not resumable({"prompt": "x", "n": 2}, chat=False)
    assert not resumable({"prompt": "x", "echo": True}, chat=False)
    assert not resumable({"prompt": [1, 2, 3]}, chat=False)
    assert resumable({"messages": [{"role": "user", "content": "x"}]}, chat=True)
    tools = StreamText({"messages": [{"role": "user", "content": "x"}]}, chat=True)
    tools.relay(event({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}}]}))
    assert tools.continuation() is None
    finished = StreamText({"prompt": "x", "max_tokens": 9}, chat=False)
    finished.relay(event({"id": "c", "choices": [{"index": 0, "text": "y", "finish_reason": "stop"}]}))
    assert finished.continuation() is None
    spent = StreamText({"prompt": "x", "max_tokens": 2}, chat=False)
    spent.relay(event({"id": "c", "choices": [{"index": 0, "text": "a"}]}) * 2)
    assert spent.continuation() is None  # nothing left to generate
