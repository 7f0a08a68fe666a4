"""However `moechat serve` ends, its engine process ends with it: SIGTERM (as `kill` and systemd send) and
SIGINT (Ctrl+C) stop both in order, also while the model is still loading; a server killed outright leaves
an engine that notices and exits by itself."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.openai_server import free_port, moechat_serve, wait_until_gone
from tests.fixtures.run_end import end_with_test_run


def engine_children(pid: int) -> list[int]:
    """The engine processes `pid` has spawned (multiprocessing's spawn children, not its resource tracker)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
        if parent == pid and b"spawn_main" in command:
            children.append(int(stat.parent.name))
    return children


# SIGINT: 130 from a terminal; 0 where the test runner was started with SIGINT ignored (a background job),
# which the server inherits (uvicorn still stops on it, then has no KeyboardInterrupt to raise)
@pytest.mark.parametrize(("sent", "exit_codes"), [(signal.SIGTERM, {128 + signal.SIGTERM}), (signal.SIGINT, {0, 130})])
def test_a_signal_ends_the_server_and_its_engine(tiny_gpt_oss, sent, exit_codes):
    with moechat_serve(tiny_gpt_oss, "--context", "128") as server:
        engine_pid = server.status()["engine_pid"]
        server.process.send_signal(sent)
        assert server.process.wait(timeout=60) in exit_codes
        assert wait_until_gone(engine_pid)


def test_sigterm_while_the_model_loads_ends_the_engine(tiny_gpt_oss):
    process = subprocess.Popen([sys.executable, "-m", "app", "serve", str(tiny_gpt_oss), "--port", str(free_port()),
                                "--context", "128"], stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=end_with_test_run)
    try:
        while "loading" not in process.stderr.read(64):  # the engine has answered with its first progress
            assert process.poll() is None, "moechat serve ended before it loaded"
        engines = engine_children(process.pid)
        assert len(engines) == 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        process.kill()
        process.wait()
    assert wait_until_gone(engines[0])


def test_an_engine_whose_server_was_killed_exits_by_itself(tiny_gpt_oss):
    with moechat_serve(tiny_gpt_oss, "--context", "128") as server:
        engine_pid = server.status()["engine_pid"]
        server.process.kill()
        server.process.wait()
        assert wait_until_gone(engine_pid)
