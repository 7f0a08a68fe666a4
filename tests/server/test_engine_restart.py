"""A server whose engine process dies (SIGKILL) or stops answering (SIGSTOP): every open request gets an
error (an error event in a stream, a 503 otherwise), the server restarts the engine with the same plan,
and the status says so; an engine that cannot be restarted leaves a server that answers 503 with why."""

import os
import re
import shutil
import signal
import threading

import httpx
import openai
import pytest

from tests.fixtures.openai_server import moechat_serve, process_gone
from tests.server.test_openai_server import client
from tests.server.test_serving_under_load import wait_for

PROMPT = [5, 6, 7]
TIMEOUT_S = 5  # the server's --engine-timeout: well above a heartbeat's 1 s on a loaded machine


@pytest.fixture(scope="module")
def model(tiny_gpt_oss, tmp_path_factory):
    """A copy of the tiny model that a test may take away."""
    return shutil.copytree(tiny_gpt_oss, tmp_path_factory.mktemp("restart") / "model")


@pytest.fixture(scope="module")
def server(model):
    with moechat_serve(model, "--context", "512", "--engine-timeout", str(TIMEOUT_S)) as running:
        yield running


def greedy(server) -> list[int]:
    answer = client(server).completions.create(model=server.model, prompt=PROMPT, max_tokens=8, temperature=0)
    return answer.moechat["token_ids"]


def long_stream(server):
    """A streamed completion that would run for 500 tokens, once its first chunk has arrived."""
    stream = iter(client(server).completions.create(model=server.model, prompt=PROMPT, max_tokens=500,
                                                    temperature=0, stream=True))
    next(stream)
    return stream


def in_background(call) -> dict:
    """Run `call()` on a thread; the returned dict gets its "result" or "error" when it ends."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except Exception as error:  # the test looks at which one it was
            outcome["error"] = error

    outcome["thread"] = threading.Thread(target=run, daemon=True)
    outcome["thread"].start()
    return outcome


def restarted(server, old_pid: int) -> dict:
    status = wait_for(lambda s: s["engine_state"] == "ready" and s["engine_pid"] != old_pid, server)
    assert process_gone(old_pid)
    return status


def test_a_killed_engine_ends_every_open_request_with_an_error_and_is_restarted(server):
    before = greedy(server)
    status = server.status()
    old_pid, restarts = status["engine_pid"], status["engine_restarts"]
    stream = long_stream(server)
    whole = in_background(lambda: client(server).completions.create(model=server.model, prompt=PROMPT,
                                                                     max_tokens=500, temperature=0))
    wait_for(lambda s: s["in_flight"] == 2, server)
    os.kill(old_pid, signal.SIGKILL)
    expected = "the engine process ended (killed by SIGKILL): the server is restarting it; send the request again"
    with pytest.raises(openai.APIError, match=re.escape(expected)):
        for _ in stream:
            pass
    whole["thread"].join(timeout=120)
    assert isinstance(whole["error"], openai.InternalServerError) and whole["error"].status_code == 503
    assert whole["error"].body["message"] == expected
    status = restarted(server, old_pid)
    assert status["engine_restarts"] == restarts + 1 and status["engine_alive"]
    assert status["engine_failure"] == "the engine process ended (killed by SIGKILL)"
    assert [r["stop_reason"] for r in status["recent"][-2:]] == ["unavailable", "unavailable"]
    assert greedy(server) == before  # the same plan, the same model


def test_a_stopped_engine_is_found_by_its_silent_heartbeat_and_replaced(server):
    before = greedy(server)
    old_pid = server.status()["engine_pid"]
    stream = long_stream(server)
    os.kill(old_pid, signal.SIGSTOP)
    with pytest.raises(openai.APIError, match=f"the engine sent nothing for {TIMEOUT_S} s \\(stopped or hung\\)"):
        for _ in stream:
            pass
    restarted(server, old_pid)  # the stopped process was killed, not left behind
    assert greedy(server) == before


def test_an_engine_that_cannot_be_restarted_leaves_a_server_that_says_why(server, model):
    """Run last in this module: the server stays without an engine."""
    old_pid = server.status()["engine_pid"]
    model.rename(model.with_name("gone"))
    try:
        os.kill(old_pid, signal.SIGKILL)
        status = wait_for(lambda s: s["engine_state"] == "stopped", server)
    finally:
        model.with_name("gone").rename(model)
    assert "its restart failed: model folder" in status["engine_failure"] and not status["engine_alive"]
    models = httpx.get(f"{server.base_url}/models", headers=server.headers, timeout=30)
    assert models.status_code == 503 and "Retry-After" not in models.headers
    assert models.json()["error"]["message"].endswith("the engine could not be restarted; restart moechat serve")
    with pytest.raises(openai.InternalServerError, match="could not be restarted"):
        greedy(server)
