"""OpenAI's error shape (edge.errors): the edge's own errors and IUs' errors in other shapes."""

from __future__ import annotations

import json

import pytest

from edge.errors import MAX_UPSTREAM_ERROR_BYTES, error_type, normalise_upstream_error

pytestmark = pytest.mark.unit


def test_types_follow_openais_names_for_the_status():
    assert [error_type(s) for s in (400, 401, 403, 404, 413, 429, 500, 502, 503)] == [
        "invalid_request_error", "authentication_error", "permission_error", "invalid_request_error",
        "invalid_request_error", "rate_limit_error", "server_error", "server_error", "server_error"]


def test_vllms_flat_and_nested_shapes_and_plain_text_become_openais():
    flat = {"object": "error", "message": "This model's maximum context length is 4096 tokens.",
            "type": "BadRequestError", "param": "prompt", "code": 400}
    assert json.loads(normalise_upstream_error(400, json.dumps(flat).encode())) == {"error": {
        "message": "This model's maximum context length is 4096 tokens.", "type": "invalid_request_error",
        "param": "prompt", "code": None}}
    nested = {"error": {"message": "The model `x` does not exist.", "type": "NotFoundError", "param": None,
                        "code": "model_not_found"}}
    assert json.loads(normalise_upstream_error(404, json.dumps(nested).encode()))["error"] == {
        "message": "The model `x` does not exist.", "type": "invalid_request_error", "param": None,
        "code": "model_not_found"}
    assert json.loads(normalise_upstream_error(500, b"Internal Server Error\n"))["error"] == {
        "message": "Internal Server Error", "type": "server_error", "param": None, "code": None}
    assert json.loads(normalise_upstream_error(422, b'{"detail": "field required"}'))["error"]["message"] == (
        "field required")


def test_an_error_body_too_long_or_too_deep_is_replaced_not_decoded():
    too_long = b'{"message": "' + b"x" * MAX_UPSTREAM_ERROR_BYTES + b'"}'
    too_deep = b"[" * 30_000 + b"]" * 30_000  # within the cap, past the decoder's depth
    for raw in (too_long, too_deep, b""):
        assert json.loads(normalise_upstream_error(503, raw)) == {"error": {
            "message": "the inference unit answered HTTP 503", "type": "server_error", "param": None, "code": None}}
