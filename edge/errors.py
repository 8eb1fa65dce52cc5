"""Every error the edge answers, in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

OpenAI's clients (openai-python, openai-node) pick their exception class by the HTTP status and read
``error.message``, ``error.type``, ``error.param`` and ``error.code`` from the body; a body in vLLM's older
flat shape (``{"object": "error", "message": ...}``) loses its message there. So the edge's own answers use
this shape, the ``type`` names OpenAI uses for the status, and a machine-readable ``code`` (the edge's
reason, also sent as the ``X-Edge-Reason`` header); an IU's error answer in another shape is rewritten to
it (:func:`normalise_upstream_error`) with its message, param and any string code kept.
"""

from __future__ import annotations

import json

from aiohttp import web

REASON_HEADER = "X-Edge-Reason"
# The largest IU error body the edge reads to rewrite it; a longer one is replaced by a generic message.
MAX_UPSTREAM_ERROR_BYTES = 64 * 1024

_TYPE_OF_STATUS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "invalid_request_error", 409: "invalid_request_error", 413: "invalid_request_error",
                   422: "invalid_request_error", 429: "rate_limit_error"}


def error_type(status: int) -> str:
    """OpenAI's ``type`` for an error answered with ``status``."""
    if status in _TYPE_OF_STATUS:
        return _TYPE_OF_STATUS[status]
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def error_response(status: int, message: str, reason: str, param: str | None = None,
                   headers: dict | None = None) -> web.Response:
    """The edge's own error answer: OpenAI's shape with ``reason`` as its code and in ``X-Edge-Reason``."""
    return web.json_response(error_body(status, message, reason, param), status=status,
                             headers={REASON_HEADER: reason, **(headers or {})})


def sse_error_event(message: str, reason: str) -> bytes:
    """An error inside an SSE stream whose 200 has already gone out (OpenAI's stream error event)."""
    return b"event: error\ndata: " + json.dumps(error_body(502, message, reason)).encode() + b"\n\n"


def normalise_upstream_error(status: int, raw: bytes) -> bytes:
    """An IU's error body (``status`` >= 400) in OpenAI's shape. vLLM's flat shape (``{"object": "error",
    "message", "type", "param", "code"}``), its newer nested one with class names as ``type``
    (``"BadRequestError"``) and numeric codes, and plain text are all read; the message and the param are kept,
    a string code is kept (an integer one repeats the status and is dropped), the type becomes OpenAI's."""
    message, param, code, decoded = None, None, None, None
    if len(raw) <= MAX_UPSTREAM_ERROR_BYTES:
        try:
            decoded = json.loads(raw)
        except RecursionError:  # nested too deep to read: replaced
            decoded = None
        except ValueError:  # not JSON: plain text is the message
            decoded = raw.decode("utf-8", "replace").strip() or None
    if isinstance(decoded, dict):
        inner = decoded.get("error") if isinstance(decoded.get("error"), dict) else decoded
        message, param, code = inner.get("message"), inner.get("param"), inner.get("code")
        if message is None and isinstance(decoded.get("detail"), str):  # FastAPI's own errors
            message = decoded["detail"]
    elif isinstance(decoded, str):
        message = decoded
    if not isinstance(message, str) or not message:
        message = f"the inference unit answered HTTP {status}"
    return json.dumps(error_body(status, message, code if isinstance(code, str) else None,
                                 param if isinstance(param, str) else None)).encode()
