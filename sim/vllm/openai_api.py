"""The OpenAI-compatible request and answer shapes a simulated IU speaks (the subset vLLM serves and the
edge proxies): ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream`` true or false) and
``GET /v1/models``.

Prompt size: the edge's estimate (``edge.tokens``: token ids exactly, text at 4 characters per token), so
the edge prices a request as the simulated engine will count it. The sim's own ``prompt_tokens`` field (an integer) overrides both, so tests can size work directly.
Errors use vLLM's ``ErrorResponse`` shape (``object: error``, ``message``, ``type``, ``code``); an unknown
``model`` is a 404 ``NotFoundError`` as vLLM answers it.
"""

from __future__ import annotations

import json
import time

from edge.tokens import estimate_prompt_tokens
from sim.vllm.workload import MAX_MODEL_LEN

MODEL_NAME = "meta-llama/Meta-Llama-3-70B-Instruct"


class ApiError(Exception):
    def __init__(self, code: int, message: str, kind: str = "BadRequestError"):
        super().__init__(message)
        self.code, self.kind = code, kind

    def body(self) -> bytes:
        return error_body(self.code, str(self), self.kind)


def error_body(code: int, message: str, kind: str) -> bytes:
    return json.dumps({"object": "error", "message": message, "type": kind, "param": None, "code": code}).encode()


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
    prompt = prompt_tokens_of(body, chat)
    if prompt + output > MAX_MODEL_LEN:  # vLLM's check; the engine could never hold such a sequence's KV
        raise ApiError(400, f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you "
                       f"requested {prompt + output} tokens ({prompt} in the messages, {output} in the completion).")
    return body, prompt, output


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
