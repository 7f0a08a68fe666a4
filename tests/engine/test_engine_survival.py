"""No request ends the engine: whatever one raises is an Error for that request, and the engine goes on
serving the others; prompts are tokenized off the decode loop; a spawned engine says it is alive."""

import json
import re
import shutil

import pytest

from app.engine.process import EngineServer
from app.protocol.engine_process import spawn_engine
from app.protocol.events import Done, Error, Heartbeat, Tokens
from app.protocol.requests import Generate, LoadModel
from tests.engine.test_engine_loop import Recorder, run_engine

REFUSING_TEMPLATE = ("{% if messages[-1]['role'] != 'user' %}{{ raise_exception('the last message must be the "
                     "user\\'s') }}{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}")


def drive(tiny_gpt_oss, *requests, context: int = 64) -> list:
    """EngineServer on the tiny model: each request handled, batches stepped to their end."""
    events = []
    server = EngineServer(events.append, lambda: False)
    for request in (LoadModel(str(tiny_gpt_oss), context=context), *requests):
        server.handle(request)
        while server.busy:
            server.step()
    return events


def ending(events, request_id: int):
    return next(e for e in events if isinstance(e, Done | Error) and e.request_id == request_id)


def test_an_exception_inside_one_request_is_its_error_and_the_next_request_is_served(tiny_gpt_oss):
    events = drive(tiny_gpt_oss, Generate(1, 4, text="a lone surrogate \ud800"), Generate(2, 4, token_ids=[5, 6, 7]))
    failed = ending(events, 1)
    assert failed.kind == "internal"
    assert failed.message.startswith("the engine failed on this request (TypeError: ")
    assert failed.message.endswith("; it goes on serving the others")
    assert isinstance(ending(events, 2), Done)
    assert sum(len(e.token_ids) for e in events if isinstance(e, Tokens) and e.request_id == 2) == 4


@pytest.mark.parametrize(("fields", "message"), [
    ({"temperature": 1e-45}, "1e-45 is not a temperature"),
    ({"temperature": float("nan")}, "nan is not a temperature"),
    ({"temperature": 0.8, "top_p": 0.0}, "0.0 is not a top-p"),
    ({"seed": 1 << 64}, "is not a seed"),
    ({"top_k": -2}, "-2 is not a top-k"),
])
def test_sampling_the_engine_cannot_do_is_refused_before_the_request_joins_the_batch(tiny_gpt_oss, fields,
                                                                                     message):
    """A neighbour decoding in the same batch is not taken down with it."""
    recorder = run_engine([LoadModel(str(tiny_gpt_oss), context=128), Generate(1, 12, token_ids=[5, 6, 7]),
                           Generate(2, 12, token_ids=[9, 8, 7], **fields)], lambda recorder, event: None,
                          expected_done=1, expected_errors=1)
    refused = next(e for e in recorder.events if isinstance(e, Error))
    assert (refused.kind, refused.request_id) == ("request", 2) and message in refused.message
    assert recorder.done(1).stop_reason in ("length", "stop") and len(recorder.tokens(1)) >= 1


def test_a_chat_template_that_raises_is_a_request_error_in_its_words(tiny_gpt_oss, tmp_path):
    folder = shutil.copytree(tiny_gpt_oss, tmp_path / "model")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": REFUSING_TEMPLATE}))
    events = drive(folder, Generate(1, 4, messages=[{"role": "user", "content": "hi"},
                                                    {"role": "assistant", "content": "hello"}]),
                   Generate(2, 4, messages=[{"role": "user", "content": "hi"}]))
    refused = ending(events, 1)
    assert (refused.kind, refused.message) == (
        "request", "the model's chat template refused these messages: the last message must be the user's")
    assert isinstance(ending(events, 2), Done)


def test_a_long_prompt_is_tokenized_while_the_other_generations_decode(tiny_gpt_oss):
    """Millions of tokens of text take the tokenizer seconds; meanwhile generation 1 goes on (on the loop
    that tokenized, it got no step until the long prompt was refused)."""
    sent = []

    def send_the_long_prompt(recorder: Recorder, event) -> None:
        if isinstance(event, Tokens) and event.request_id == 1 and len(recorder.tokens(1)) == 2 and not sent:
            sent.append(len(recorder.events))
            recorder.requests.put(Generate(2, 5, text="word " * 1_000_000))

    recorder = run_engine([LoadModel(str(tiny_gpt_oss), context=256), Generate(1, 200, token_ids=[5, 6, 7])],
                          send_the_long_prompt, expected_done=1, expected_errors=1)
    refused = next(index for index, e in enumerate(recorder.events) if isinstance(e, Error))
    assert re.match(r"the prompt has \d{7} tokens but the context holds 256", recorder.events[refused].message)
    meanwhile = [e for e in recorder.events[sent[0]:refused] if isinstance(e, Tokens) and e.request_id == 1]
    assert len(meanwhile) >= 10


def test_a_spawned_engine_sends_heartbeats_while_idle():
    """They start before torch is imported: the process may still be importing when Shutdown comes."""
    engine = spawn_engine()
    try:
        beats = [engine.events.get(timeout=60) for _ in range(2)]
        assert all(isinstance(beat, Heartbeat) for beat in beats)
    finally:
        engine.stop(timeout_s=300)
    assert engine.process.exitcode == 0
