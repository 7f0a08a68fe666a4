"""`moechat serve` under load: a bounded queue (429 past it), clients that go away, and a burst of streams."""

import json
import socket
import threading
import time
from urllib.parse import urlparse

import openai

from tests.server.test_openai_server import COMPLETION_PROMPT, client

LONG = 300  # tokens a held request would run to (greedy, no stop token on this prompt)


def open_raw_stream(server, max_tokens: int) -> socket.socket:
    """A streaming completion sent on a bare socket whose answer is never read (a client that stalls)."""
    address = urlparse(server.base_url)
    body = json.dumps({"model": server.model, "prompt": COMPLETION_PROMPT, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {address.netloc}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {server.api_key}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    connection = socket.create_connection((address.hostname, address.port))
    connection.sendall(head + body)
    return connection


def wait_for(condition, server, attempts: int = 1200) -> dict:
    """The server's status once `condition(status)` holds (polled, 50 ms apart)."""
    for _ in range(attempts):
        status = server.status()
        if condition(status):
            return status
        time.sleep(0.05)
    raise AssertionError(f"condition never held; last status {status}")


def test_a_full_queue_answers_429_and_clients_that_go_away_free_their_places(served_tiny_gpt_oss):
    server = served_tiny_gpt_oss
    before = server.status()
    held = [open_raw_stream(server, LONG) for _ in range(before["max_in_flight"])]  # 4 decoding, 4 waiting
    try:
        wait_for(lambda status: status["in_flight"] == before["max_in_flight"], server)
        api = client(server)
        try:
            api.completions.create(model=server.model, prompt="hi", max_tokens=2)
            raise AssertionError("a request past the bound was accepted")
        except openai.RateLimitError as error:
            assert "the server is busy" in str(error)
    finally:
        for connection in held:
            connection.close()
    status = wait_for(lambda status: status["in_flight"] == 0, server)
    gone = [r for r in status["recent"] if r["cancelled_because"] == "client disconnected"][-len(held):]
    assert len(gone) == len(held)
    # every place is freed long before its answer would have ended; a waiting one may have started in the
    # moment between a decoding neighbour's cancel and its own client's disconnect being seen (one poll)
    assert all(r["stop_reason"] == "cancelled" and r["generated_tokens"] < LONG for r in gone)
    again = api.completions.create(model=server.model, prompt=COMPLETION_PROMPT, max_tokens=3, temperature=0)
    assert again.usage.completion_tokens == 3


def test_32_concurrent_streaming_clients_all_finish_or_get_429_and_the_engine_survives(served_tiny_gpt_oss):
    server = served_tiny_gpt_oss
    engine_pid = server.status()["engine_pid"]
    outcomes: list = [None] * 32
    start = threading.Barrier(32)
    api = client(server)  # one connection pool, 32 connections

    def chat(index: int) -> None:
        start.wait()
        try:
            chunks = list(api.chat.completions.create(
                model=server.model, messages=[{"role": "user", "content": f"client {index}"}], max_tokens=6,
                temperature=0, stream=True))
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            outcomes[index] = "finished" if finish in (["length"], ["stop"]) else f"ended without a finish: {finish}"
        except openai.RateLimitError:
            outcomes[index] = "429"
        except Exception as error:  # any other outcome fails the test below, with its words
            outcomes[index] = repr(error)

    threads = [threading.Thread(target=chat, args=(i,), daemon=True) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert not any(thread.is_alive() for thread in threads), "a client hung"
    assert set(outcomes) <= {"finished", "429"}, outcomes
    assert "finished" in outcomes
    status = wait_for(lambda status: status["in_flight"] == 0, server)
    assert status["engine_pid"] == engine_pid and status["engine_alive"]
