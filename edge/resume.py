"""Resuming a stream cut mid-way: what the client has been sent, and the request that continues it.

The edge relays a streamed completion's SSE events; for a request it can resume (one choice, text only:
:func:`resumable`) it reads each event's text delta as it passes (:class:`StreamText`), so when the IU dies
or stalls mid-stream it knows the text the client has. Another IU is then asked to continue it:

- chat: the request's messages plus the partial assistant message, with ``continue_final_message: true``
  and ``add_generation_prompt: false`` (vLLM's chat API since 0.6.x: the model continues that message
  instead of opening a new turn; the client's own final assistant message, when it asked for that, is
  extended);
- completions: the prompt plus the text so far;
- ``max_tokens`` (or ``max_completion_tokens``) reduced by the tokens already sent: the larger of the
  events with text (vLLM sends one token per event) and the text's length at 4 characters per token, so
  the answer may come out a little shorter than asked, never longer.

The continuation's events are rewritten into the first stream's (:meth:`StreamText.splice`): its ``id``,
no second role delta, its usage counting the tokens sent before as completion tokens, not prompt tokens.
The relay writes whole events only, so a cut never leaves half an event in front of the continuation.
"""

from __future__ import annotations

import json
import math

from edge.tokens import CHARS_PER_TOKEN

DONE = b"data: [DONE]"


def resumable(body: dict, chat: bool) -> bool:
    """Whether a stream of ``body`` can be continued elsewhere from its text alone."""
    if body.get("n", 1) != 1 or body.get("best_of", 1) not in (1, None) or body.get("echo"):
        return False
    if chat:
        messages = body.get("messages")
        return isinstance(messages, list) and bool(messages) and all(isinstance(m, dict) for m in messages)
    return isinstance(body.get("prompt"), str)


class StreamText:
    """One streamed answer as the client received it: whole events only, and each choice's text."""

    def __init__(self, body: dict, chat: bool):
        self.body, self.chat = body, chat
        self.resumable = resumable(body, chat)
        self.pending = b""  # bytes of an event not complete yet
        self.text = ""
        self.text_events = 0
        self.id: str | None = None
        self.done = False  # [DONE] or a finish_reason seen: nothing left to resume
        self.sent_before = 0  # tokens sent before the current continuation (its usage is rewritten by it)
        self.resumptions = 0

    def relay(self, chunk: bytes, splice: bool = False) -> bytes:
        """The complete events of ``chunk`` (plus what was pending) to write to the client, rewritten when
        ``splice`` (a continuation's); the rest is kept until its event is complete."""
        data = self.pending + chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self.pending = data
            return b""
        self.pending = data[end + 2:]
        out = []
        for event in data[:end].split(b"\n\n"):
            event = self._read(event, splice)
            if event is not None:
                out.append(event + b"\n\n")
        return b"".join(out)

    def _read(self, event: bytes, splice: bool) -> bytes | None:
        payload = next((line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")), None)
        if payload is None or not self.resumable:
            return event
        if payload == b"[DONE]":
            self.done = True
            return event
        try:
            parsed = json.loads(payload)
        except ValueError:
            return event
        if not isinstance(parsed, dict):
            return event
        if self.id is None:
            self.id = parsed.get("id")
        role_only = self._take(parsed)
        if not splice:
            return event
        if role_only:
            return None  # the client had the assistant role from the first stream
        if self.id is not None:
            parsed["id"] = self.id
        usage = parsed.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            moved = min(self.sent_before, usage.get("prompt_tokens") or 0)
            usage["completion_tokens"] += moved
            usage["prompt_tokens"] = (usage.get("prompt_tokens") or 0) - moved
        return b"data: " + json.dumps(parsed).encode()

    def _take(self, event: dict) -> bool:
        """Fold one event's choices into the text; True for a chat role delta carrying no text."""
        role_only = False
        for choice in event.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                self.resumable = False
                continue
            if self.chat:
                delta = choice.get("delta") or {}
                if delta.get("tool_calls") or delta.get("function_call") or delta.get("reasoning_content"):
                    self.resumable = False
                text = delta.get("content")
                role_only = "role" in delta and not text and not choice.get("finish_reason")
            else:
                text = choice.get("text")
            if isinstance(text, str) and text:
                self.text += text
                self.text_events += 1
            if choice.get("finish_reason"):
                self.done = True
        return role_only

    def tokens_sent(self) -> int:
        return max(self.text_events, math.ceil(len(self.text) / CHARS_PER_TOKEN))

    def continuation(self) -> dict | None:
        """The request that continues this stream on another IU; None when it cannot be resumed (or has
        nothing left to generate)."""
        if not self.resumable or self.done:
            return None
        body = dict(self.body)
        sent = self.tokens_sent()
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int):
                if body[key] - sent <= 0:
                    return None
                body[key] -= sent
        if not self.chat:
            if "max_tokens" not in body and "max_completion_tokens" not in body:
                if 16 - sent <= 0:  # vLLM's default for completions
                    return None
                body["max_tokens"] = 16 - sent
            body["prompt"] = self.body["prompt"] + self.text
        else:
            messages = list(self.body["messages"])
            last = messages[-1]
            if (self.body.get("continue_final_message") and last.get("role") == "assistant"
                    and isinstance(last.get("content"), str)):
                messages[-1] = {**last, "content": last["content"] + self.text}
            else:
                messages.append({"role": "assistant", "content": self.text})
            body["messages"] = messages
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        self.sent_before = sent
        self.resumptions += 1
        self.pending = b""  # a cut event never reached the client
        return body
