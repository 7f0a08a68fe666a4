"""`moechat serve` as a real subprocess, driven by the official `openai` client."""

import json
import subprocess
import sys
import threading

import httpx
import openai
import pytest

from app.cli import main

COMPLETION_PROMPT = [5, 6, 7]  # greedy: runs to max_tokens on the tiny model (no stop token early)


def client(server, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0, timeout=120, **options)


def generated(capsys, model, *args) -> dict:
    """The oracle: `moechat generate ... --json` for the same prompt."""
    assert main(["generate", str(model), *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_models_lists_the_served_model(served_tiny_gpt_oss):
    assert [m.id for m in client(served_tiny_gpt_oss).models.list()] == [served_tiny_gpt_oss.model]


def test_chat_streamed_and_not_is_token_identical_to_moechat_generate(served_tiny_gpt_oss, tiny_gpt_oss, capsys):
    api = client(served_tiny_gpt_oss)
    messages = [{"role": "user", "content": "Hello there"}]
    whole = api.chat.completions.create(model=served_tiny_gpt_oss.model, messages=messages, max_tokens=12,
                                        temperature=0)
    expected = generated(capsys, tiny_gpt_oss, "--chat", "--prompt", "Hello there", "--max-new-tokens", 12)
    assert whole.moechat["token_ids"] == expected["token_ids"]
    assert whole.choices[0].message.content == expected["text"]
    assert (whole.choices[0].message.model_extra.get("reasoning_content") or "") == expected.get("reasoning", "")
    assert whole.usage.prompt_tokens == expected["stats"]["prefill_tokens"]
    assert whole.usage.completion_tokens == len(expected["token_ids"])
    assert whole.choices[0].finish_reason == {"length": "length", "stop": "stop"}[expected["stop_reason"]]
    stats = whole.moechat["stats"]
    assert stats["expert_cache"]["misses"] > 0 and stats["decode_tokens"] == len(expected["token_ids"]) - 1

    chunks = list(api.chat.completions.create(model=served_tiny_gpt_oss.model, messages=messages, max_tokens=12,
                                              temperature=0, stream=True, stream_options={"include_usage": True}))
    assert [t for c in chunks if c.model_extra.get("moechat") for t in c.moechat["token_ids"]] == \
        expected["token_ids"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [whole.choices[0].finish_reason]
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_completions_streamed_and_not_match_moechat_generate(served_tiny_gpt_oss, tiny_gpt_oss, capsys):
    api = client(served_tiny_gpt_oss)
    whole = api.completions.create(model=served_tiny_gpt_oss.model, prompt=COMPLETION_PROMPT, max_tokens=10,
                                   temperature=0)
    expected = generated(capsys, tiny_gpt_oss, "--prompt-ids", "5,6,7", "--max-new-tokens", 10)
    assert whole.moechat["token_ids"] == expected["token_ids"]
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 10
    streamed = list(api.completions.create(model=served_tiny_gpt_oss.model, prompt=COMPLETION_PROMPT, max_tokens=10,
                                           temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text
    assert [t for c in streamed for t in c.moechat["token_ids"]] == expected["token_ids"]


def test_stop_strings_end_the_answer_before_them(served_tiny_gpt_oss):
    api = client(served_tiny_gpt_oss)
    full = api.completions.create(model=served_tiny_gpt_oss.model, prompt=COMPLETION_PROMPT, max_tokens=12,
                                  temperature=0).choices[0].text
    stop = full[4:6]
    cut = api.completions.create(model=served_tiny_gpt_oss.model, prompt=COMPLETION_PROMPT, max_tokens=12,
                                 temperature=0, stop=[stop])
    assert cut.choices[0].text == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop" and cut.usage.prompt_tokens == 3
    streamed = api.completions.create(model=served_tiny_gpt_oss.model, prompt=COMPLETION_PROMPT, max_tokens=12,
                                      temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text


def test_seeded_sampling_reproduces_and_concurrent_requests_equal_sequential_ones(served_tiny_gpt_oss):
    api = client(served_tiny_gpt_oss)
    requests = [dict(prompt=[5 + i, 6 + 3 * i, 7], max_tokens=4 + 2 * i, temperature=0) for i in range(3)]
    requests.append(dict(prompt=[9, 8, 7, 6], max_tokens=7, temperature=0.9, top_p=0.8, seed=5))

    def complete(request: dict):
        return api.completions.create(model=served_tiny_gpt_oss.model, **request)

    sequential = [complete(r) for r in requests]
    concurrent: list = [None] * len(requests)
    start = threading.Barrier(len(requests))

    def run(index: int) -> None:
        start.wait()
        concurrent[index] = complete(requests[index])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert [c.moechat["token_ids"] for c in concurrent] == [s.moechat["token_ids"] for s in sequential]
    assert max(c.moechat["stats"]["batch"]["mean_size"] for c in concurrent) > 1  # they were decoded together


def test_wrong_or_missing_key_is_401_and_bad_requests_are_one_readable_error(served_tiny_gpt_oss):
    model = served_tiny_gpt_oss.model
    with pytest.raises(openai.AuthenticationError, match="invalid API key"):
        client(served_tiny_gpt_oss, ).with_options(api_key="wrong").models.list()
    missing = httpx.post(f"{served_tiny_gpt_oss.base_url}/chat/completions", json={"model": model, "messages": []})
    assert missing.status_code == 401 and "missing API key" in missing.json()["error"]["message"]
    api = client(served_tiny_gpt_oss)
    with pytest.raises(openai.NotFoundError, match="this server serves"):
        api.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        api.completions.create(model=model, prompt=[5, 100000], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        api.completions.create(model=model, prompt="hi", max_tokens=2, temperature=7)


def test_a_non_loopback_bind_without_a_key_is_refused_in_words(tiny_gpt_oss, capsys):
    assert main(["serve", str(tiny_gpt_oss), "--host", "0.0.0.0"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "moechat: error: --host 0.0.0.0 lets other machines connect: give --api-key KEY (clients then send "
        "'Authorization: Bearer KEY'), or bind to 127.0.0.1"
    ]


def test_the_http_process_does_not_load_torch():
    """The server's own process only moves messages; torch lives in the engine process."""
    result = subprocess.run([sys.executable, "-c", "import sys, app.server.serve; print('torch' in sys.modules)"],
                            capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr
