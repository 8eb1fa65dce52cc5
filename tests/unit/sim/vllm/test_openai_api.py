"""The simulated vLLM's OpenAI API answers as the vLLM version it names."""

from __future__ import annotations

import json

import pytest

from sim.vllm import openai_api
from sim.vllm.openai_api import ApiError, parse_request

pytestmark = pytest.mark.unit


def test_errors_have_the_nested_error_info_shape_of_the_version_named():
    assert json.loads(openai_api.version_body()) == {"version": openai_api.VLLM_VERSION}
    with pytest.raises(ApiError) as info:
        parse_request(json.dumps({"model": "other", "prompt": "x"}).encode(), chat=False)
    assert json.loads(info.value.body()) == {"error": {
        "message": "The model `other` does not exist.", "type": "NotFoundError", "param": None, "code": 404}}


def test_continue_final_message_needs_no_generation_prompt_and_an_assistant_message_last():
    user = [{"role": "user", "content": "hi"}]
    assistant = user + [{"role": "assistant", "content": "Hello " * 40}]
    for messages, extra in ((assistant, {}), (user, {"add_generation_prompt": False})):
        with pytest.raises(ApiError) as info:
            parse_request(json.dumps({"messages": messages, "continue_final_message": True, **extra}).encode(),
                          chat=True)
        assert info.value.code == 400
    body = {"messages": assistant, "continue_final_message": True, "add_generation_prompt": False}
    _, prompt, _ = parse_request(json.dumps(body).encode(), chat=True)
    assert prompt > 60  # the partial message counts in the prompt


def test_include_usage_ends_with_a_usage_event_without_choices():
    assert openai_api.wants_usage({"stream_options": {"include_usage": True}})
    assert not openai_api.wants_usage({"stream_options": None})
    usage = json.loads(openai_api.usage_event("cmpl-1", False, 10, 4)[6:])
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 10, "completion_tokens": 4,
                                                         "total_tokens": 14}


def test_the_prompt_content_the_engine_hashes():
    assert openai_api.prompt_token_ids({"prompt": [5, 6, 7]}, chat=False) == [5, 6, 7]
    assert openai_api.prompt_token_ids({"prompt": [5, 6], "prompt_tokens": 900}, chat=False) is None
    assert openai_api.prompt_token_ids({"prompt": [[1, 2], [3]]}, chat=False) is None  # a batch
    text = "You are a helpful assistant. " * 8
    ids = openai_api.prompt_token_ids({"prompt": text}, chat=False)
    assert len(ids) == len(text) // 4 and ids == openai_api.prompt_token_ids({"prompt": text + "More?"}, chat=False)[:len(ids)]
    chat = [{"role": "system", "content": text}, {"role": "user", "content": "Hi"}]
    turn = openai_api.prompt_token_ids({"messages": chat}, chat=True)
    longer = chat + [{"role": "assistant", "content": "Hello"}, {"role": "user", "content": "And?"}]
    assert openai_api.prompt_token_ids({"messages": longer}, chat=True)[:len(turn) - 1] == turn[:-1]
    other = [{"role": "system", "content": "Be brief. " + text}, chat[1]]
    assert openai_api.prompt_token_ids({"messages": other}, chat=True)[:4] != turn[:4]
