"""Every request field is checked at the server's edge, with the official `openai` client as the caller:
unsupported OpenAI fields are refused with a 400 in OpenAI's shape (not ignored), out-of-range values are
refused in words, content given as text parts is read, a chat without max_tokens gets the server's cap,
and none of it reaches (or ends) the engine."""

import json

import httpx
import openai
import pytest

from tests.server.test_openai_server import client, generated

MESSAGES = [{"role": "user", "content": "Hello there"}]
TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}


def refusal(call) -> dict:
    """The body of the 400 that `call()` gets."""
    with pytest.raises(openai.BadRequestError) as refused:
        call()
    assert refused.value.status_code == 400
    return refused.value.body


@pytest.mark.parametrize(("fields", "param", "message"), [
    ({"logprobs": True}, "logprobs", "logprobs: this server does not support logprobs (leave it out)"),
    ({"top_logprobs": 3}, "top_logprobs", "top_logprobs: this server does not support top_logprobs"),
    ({"tools": [TOOL]}, "tools", "tools: this server does not support tools"),
    ({"tool_choice": "required"}, "tool_choice", "tool_choice: this server does not support tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format", "response_format: this server does not"),
    ({"frequency_penalty": 0.5}, "frequency_penalty", "frequency_penalty: this server does not support"),
    ({"logit_bias": {"5": 10}}, "logit_bias", "logit_bias: this server does not support"),
    ({"extra_body": {"mirostat": 2}}, "mirostat", "mirostat: this server does not know the field 'mirostat'"),
    ({"n": 2}, "n", "n: only one choice per request is supported (n = 1)"),
    ({"temperature": 1e-45}, "temperature", "temperature: 1e-45 is not a temperature this engine samples at: "
                                            "use 0 (greedy) or 0.001 … 2"),
    ({"temperature": 7}, "temperature", "temperature: 7.0 is not a temperature"),
    ({"temperature": 0.7, "top_p": 0}, "top_p", "top_p: 0.0 is not a top-p"),
    ({"seed": 1 << 64}, "seed", f"seed: {1 << 64} is not a seed: use a whole number from 0 to 2^64 - 1"),
    ({"seed": -1}, "seed", "seed: -1 is not a seed"),
    ({"extra_body": {"top_k": -1}}, "top_k", "top_k: -1 is not a top-k"),
    ({"max_tokens": 100_000}, "max_tokens", "max_tokens: 100000 is more than this server's context (1024 tokens)"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "stop: at most 4 stop strings of at most 256 characters"),
    ({"stop": "x" * 300}, "stop", "stop: at most 4 stop strings"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort", "reasoning_effort: use one of low, medium, high"),
])
def test_a_chat_field_the_server_cannot_honour_is_a_400_that_names_it(served_tiny_gpt_oss, fields, param, message):
    server = served_tiny_gpt_oss
    body = refusal(lambda: client(server).chat.completions.create(
        model=server.model, messages=MESSAGES, **{"max_tokens": 4, **fields}))
    assert body["message"].startswith(message), body
    assert (body["type"], body["param"]) == ("invalid_request_error", param)


@pytest.mark.parametrize(("messages", "message"), [
    ([{"role": "user", "content": [{"type": "text", "text": "hi"},
                                   {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
     "messages[0].content[1]: this model reads text only ('image_url' parts are not supported)"),
    ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "42", "tool_call_id": "c1"}],
     "messages[1].role: 'tool' is not one this server takes (tools and their results are not supported)"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                             "function": {"name": "f", "arguments": "{}"}}]}],
     "messages[0]: this server does not support the message field 'tool_calls'"),
    ([{"role": "user", "content": {"text": "hi"}}], "messages[0].content: give text, or a list of text parts"),
    (["hi"], "messages[0]: a message is an object with a 'role' and a 'content'"),
])
def test_messages_the_server_cannot_read_are_a_400_that_says_where(served_tiny_gpt_oss, messages, message):
    server = served_tiny_gpt_oss
    body = refusal(lambda: client(server).chat.completions.create(model=server.model, messages=messages,
                                                                  max_tokens=4))
    assert body["message"].startswith(message), body


@pytest.mark.parametrize(("fields", "message"), [
    ({"logprobs": 2}, "logprobs: this server does not support logprobs"),
    ({"echo": True}, "echo: this server does not support echo"),
    ({"suffix": "end"}, "suffix: this server does not support suffix"),
    ({"best_of": 3}, "best_of: this server does not support best_of"),
    ({"prompt": []}, "prompt: give 1 to 1023 token ids (the context holds 1024)"),
    ({"prompt": [5, -1]}, "prompt: token ids are whole numbers from 0"),
])
def test_a_completion_field_the_server_cannot_honour_is_a_400(served_tiny_gpt_oss, fields, message):
    server = served_tiny_gpt_oss
    body = refusal(lambda: client(server).completions.create(
        model=server.model, **{"prompt": [5, 6, 7], "max_tokens": 4, **fields}))
    assert body["message"].startswith(message), body


@pytest.mark.parametrize(("raw", "message"), [
    ('{"role": "user", "content": "abc\\ud800"}',
     "messages[0].content: the text is not valid Unicode: a lone surrogate ('\\ud800') at character 3"),
    ('{"role": "user", "content": "hi", "name": "\\udfff"}',
     "messages[0].name: the text is not valid Unicode: a lone surrogate ('\\udfff') at character 0"),
])
def test_text_that_cannot_be_tokenized_is_a_400_and_the_engine_stays(served_tiny_gpt_oss, raw, message):
    """The openai client cannot even encode such text: the JSON is written by hand, as any client may."""
    server = served_tiny_gpt_oss
    engine_pid = server.status()["engine_pid"]
    body = f'{{"model": "{server.model}", "max_tokens": 4, "messages": [{raw}]}}'
    response = httpx.post(f"{server.base_url}/chat/completions", content=body,
                          headers={**server.headers, "Content-Type": "application/json"}, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == message
    nan = httpx.post(f"{server.base_url}/completions", content=json.dumps(
        {"model": server.model, "prompt": "hi", "max_tokens": 2, "temperature": float("nan")}),
        headers={**server.headers, "Content-Type": "application/json"}, timeout=60)
    assert nan.status_code == 400 and nan.json()["error"]["message"].startswith("temperature: nan is not a")
    status = server.status()
    assert status["engine_pid"] == engine_pid and status["engine_restarts"] == 0 and status["engine_alive"]


def test_fields_that_ask_for_nothing_are_accepted(served_tiny_gpt_oss):
    server = served_tiny_gpt_oss
    answer = client(server).chat.completions.create(
        model=server.model, messages=MESSAGES, max_tokens=3, temperature=0, presence_penalty=0, logprobs=False,
        tool_choice="none", response_format={"type": "text"}, user="someone", store=False, n=1)
    assert answer.usage.completion_tokens == 3


def test_content_given_as_text_parts_is_read_as_their_text(served_tiny_gpt_oss):
    server = served_tiny_gpt_oss
    api = client(server)
    parts = api.chat.completions.create(model=server.model, max_tokens=8, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}])
    text = api.chat.completions.create(model=server.model, max_tokens=8, temperature=0,
                                       messages=[{"role": "user", "content": "Hello\nthere"}])
    assert parts.moechat["token_ids"] == text.moechat["token_ids"]
    assert parts.usage.prompt_tokens == text.usage.prompt_tokens


def test_a_chat_without_max_tokens_gets_the_servers_cap(served_tiny_gpt_oss, tiny_gpt_oss, capsys):
    """The session's server runs with --default-max-tokens 24: the answer is moechat generate's 24 tokens,
    not one that may hold the whole KV cache until its context is full."""
    expected = generated(capsys, tiny_gpt_oss, "--chat", "--prompt", "Hello there", "--max-new-tokens", 24)
    assert expected["stop_reason"] == "length"  # the tiny model does not stop by itself before 24 tokens
    server = served_tiny_gpt_oss
    answer = client(server).chat.completions.create(model=server.model, messages=MESSAGES, temperature=0)
    assert answer.moechat["token_ids"] == expected["token_ids"]
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 24
