"""The app ends cleanly: no interpreter abort at exit, and the engine process ends with the window, also
when the app is sent SIGTERM.

The abort ("Fatal Python error: bool_dealloc … refcount error in a C extension", exit 134) was PySide6
6.12.0's: every `Signal.emit` gave back a reference to True it did not own, so after enough emits (the
engine's events are emitted every frame) True was freed, at the latest when the interpreter tore down.
pyproject.toml excludes that release; the first test fails on any PySide6 that does it again."""

import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.protocol.requests import LoadModel, Shutdown
from app.ui.engine_client import EngineClient
from tests.fixtures.run_end import end_with_test_run
from tests.ui.test_engine_client import StandInEngine
from tests.ui.test_window_with_engine import ENGINE_S


class Emitter(QObject):
    happened = Signal(object)


def test_emitting_a_signal_leaves_the_interpreters_references_alone(qtbot):
    emitter = Emitter()
    received = []
    emitter.happened.connect(received.append)
    before = sys.getrefcount(True), sys.getrefcount(False)
    for _ in range(1000):
        emitter.happened.emit(0)
    after = sys.getrefcount(True), sys.getrefcount(False)
    assert len(received) == 1000
    assert abs(after[0] - before[0]) < 10 and abs(after[1] - before[1]) < 10  # 6.12.0: True lost 1000


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def is_running(pid: int) -> bool:
    """Alive and not a zombie waiting for its parent."""
    status = Path(f"/proc/{pid}/status")
    try:
        return "State:\tZ" not in status.read_text()
    except OSError:
        return False


def test_sigterm_closes_the_app_and_its_engine_ends_with_it(tmp_path):
    environment = {**os.environ, "XDG_DATA_HOME": str(tmp_path), "QT_QPA_PLATFORM": "offscreen"}
    app = subprocess.Popen([sys.executable, "-m", "app"], env=environment, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, preexec_fn=end_with_test_run)
    settings = tmp_path / "moechat" / "settings.json"
    try:
        deadline = time.monotonic() + ENGINE_S / 1000
        while not (settings.exists() and json.loads(settings.read_text()).get("last_load")):
            assert app.poll() is None and time.monotonic() < deadline, "the demo did not load at the first run"
            time.sleep(0.2)
        engines = children(app.pid)
        assert engines and all(is_running(pid) for pid in engines)
        app.send_signal(signal.SIGTERM)
        _, stderr = app.communicate(timeout=30)
    finally:
        if app.poll() is None:
            app.kill()
            app.communicate()
    assert app.returncode == 0, stderr
    assert "Fatal Python error" not in stderr and "Traceback" not in stderr, stderr
    # the engine is stopped before the app returns; multiprocessing's resource tracker, also a child, ends once it
    # reads the end of the app's pipe, a moment later on a loaded machine
    deadline = time.monotonic() + 5
    while [pid for pid in engines if is_running(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in engines if is_running(pid)]


def test_an_engine_client_dropped_without_shutdown_still_ends_its_engine(qtbot):
    spawn = StandInEngine()
    client = EngineClient(spawn)
    client.load(LoadModel("/models/tiny"))
    engine = spawn.spawned[0]
    del client
    gc.collect()
    assert engine.process.exitcode == 0  # it was told to shut down (and joined)
    requests = [engine.requests.get_nowait() for _ in range(engine.requests.qsize())]
    assert requests[-1] == Shutdown()
