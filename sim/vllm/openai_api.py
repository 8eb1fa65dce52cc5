"""The OpenAI-compatible request and answer shapes a simulated IU speaks (the subset vLLM serves and the
edge proxies): ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream`` true or false) and
``GET /v1/models``.

Prompt size: the edge's estimate (``edge.tokens``: token ids exactly, text at 4 characters per token), so
the edge prices a request as the simulated engine will count it. The sim's own ``prompt_tokens`` field (an integer) overrides both, so tests can size work directly.
Prompt content (:func:`prompt_token_ids`, what the engine's prefix cache hashes): token ids as sent; text
as one id per 4-character piece (the same estimate, so equal leading text gives equal leading ids); chat
as its messages' roles and text in order. A ``prompt_tokens`` request, or a batch, has no known content.
It answers as vLLM ``VLLM_VERSION`` does (``GET /version``): errors in that version's ``ErrorResponse`` shape,
``{"error": {"message", "type", "param", "code"}}`` with vLLM's class name as ``type`` and the HTTP status as
the integer ``code`` (vLLM's ``ErrorInfo``; releases before 0.10.2 answered the flat ``{"object": "error",
...}``); an unknown ``model`` is a 404 ``NotFoundError``. ``stream_options.include_usage`` ends a stream with
a usage event whose ``choices`` is empty, before ``[DONE]``; chat's ``continue_final_message`` (with
``add_generation_prompt: false``; both true is a 400, as is continuing a final message that is not the
assistant's) continues the last message, whose text counts in the prompt.
"""

from __future__ import annotations

import json
import time
import zlib

from edge.tokens import CHARS_PER_TOKEN, estimate_prompt_tokens, prompt_parts
from sim.vllm.workload import MAX_MODEL_LEN

MODEL_NAME = "meta-llama/Meta-Llama-3-70B-Instruct"
VLLM_VERSION = "0.11.0"


class ApiError(Exception):
    def __init__(self, code: int, message: str, kind: str = "BadRequestError"):
        super().__init__(message)
        self.code, self.kind = code, kind

    def body(self) -> bytes:
        return error_body(self.code, str(self), self.kind)


def error_body(code: int, message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


def prompt_tokens_of(body: dict, chat: bool) -> int:
    """Prompt tokens of a request body (module docstring); raises ApiError for a body vLLM would refuse."""
    explicit = body.get("prompt_tokens")
    if explicit is not None:
        if not isinstance(explicit, int) or isinstance(explicit, bool) or explicit <= 0:
            raise ApiError(400, f"prompt_tokens must be a positive integer, got {explicit!r}")
        return explicit
    tokens = estimate_prompt_tokens(body, chat)
    if tokens is None:
        raise ApiError(400, "messages (a list of {role, content})" if chat else
                       "prompt (text or token ids) or prompt_tokens is required")
    return tokens


def prompt_token_ids(body: dict, chat: bool) -> list[int] | None:
    """The prompt's token ids as the simulated engine hashes them (module docstring); None when unknown."""
    if body.get("prompt_tokens") is not None:
        return None
    prompt = body.get("prompt")
    if not chat and isinstance(prompt, list) and prompt \
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    if chat or isinstance(prompt, str):
        text = "".join(prompt_parts(body, chat)).encode()
        return [zlib.crc32(text[i:i + CHARS_PER_TOKEN]) for i in range(0, len(text), CHARS_PER_TOKEN)] or None
    return None


def parse_request(raw: bytes, chat: bool, served: str = MODEL_NAME) -> tuple[dict, int, int]:
    """(body, prompt tokens, max tokens) of one request; ApiError for what vLLM answers 400 or 404."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise ApiError(400, f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, f"expected a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if model is not None and model != served:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
    output = body.get("max_tokens", body.get("max_completion_tokens", 16))
    if not isinstance(output, int) or isinstance(output, bool) or output <= 0:
        raise ApiError(400, f"max_tokens must be a positive integer, got {output!r}")
    if chat:
        _check_continuation(body)
    prompt = prompt_tokens_of(body, chat)
    if prompt + output > MAX_MODEL_LEN:  # vLLM's check; the engine could never hold such a sequence's KV
        raise ApiError(400, f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you "
                       f"requested {prompt + output} tokens ({prompt} in the messages, {output} in the completion).")
    return body, prompt, output


def _check_continuation(body: dict) -> None:
    """vLLM's checks on ``continue_final_message`` (its chat request's model validator)."""
    if not body.get("continue_final_message"):
        return
    if body.get("add_generation_prompt", True):
        raise ApiError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict) \
            or messages[-1].get("role") != "assistant":
        raise ApiError(400, "continue_final_message requires the final message to be the assistant's")


def wants_usage(body: dict) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def usage_event(rid: str, chat: bool, prompt: int, completion: int, served: str = MODEL_NAME) -> bytes:
    """The last event of a stream asked for ``include_usage``: no choices, the request's usage."""
    event = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
             "created": int(time.time()), "model": served, "choices": [],
             "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def version_body() -> bytes:
    return json.dumps({"version": VLLM_VERSION}).encode()


def models_body(served: str = MODEL_NAME) -> bytes:
    return json.dumps({"object": "list", "data": [
        {"id": served, "object": "model", "created": 0, "owned_by": "vllm", "root": served}]}).encode()


def chunk_event(rid: str, chat: bool, tokens: int, served: str = MODEL_NAME, finish: str | None = None) -> bytes:
    """One SSE event carrying ``tokens`` generated tokens (one word "tok " each)."""
    text = "tok " * tokens
    if chat:
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish}
        kind = "text_completion"
    event = {"id": rid, "object": kind, "created": int(time.time()), "model": served, "choices": [choice]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"


def completion_body(rid: str, chat: bool, prompt: int, result: dict, served: str = MODEL_NAME) -> bytes:
    """A non-streaming answer; the sim's model-time ``ttft_s``/``e2e_s`` ride along as extra fields."""
    text = "tok " * result["completion_tokens"]
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
              if chat else {"index": 0, "text": text, "finish_reason": "length"})
    usage = {"prompt_tokens": prompt, "completion_tokens": result["completion_tokens"],
             "total_tokens": prompt + result["completion_tokens"]}
    return json.dumps({"id": rid, "object": "chat.completion" if chat else "text_completion",
                       "created": int(time.time()), "model": served, "choices": [choice], "usage": usage,
                       **result}).encode()
