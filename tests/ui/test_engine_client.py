"""EngineClient against a stand-in engine: events become signals, tokens are batched per frame,
and a dead process is reported in words once its last events are out."""

import queue
import signal

from app.protocol.engine_process import EngineProcess
from app.protocol.events import Done, Error, Loaded, ModelInfo, StepStats, Tokens
from app.protocol.kinds import ErrorKind, StopReason
from app.protocol.requests import Generate, LoadModel
from app.ui.engine_client import EngineClient
from app.ui.engines import exit_reason

INFO = ModelInfo("/models/tiny", "gpt_oss", vocab_size=256, context=64, expert_slots=8, total_experts=8,
                 device_bytes=1, has_tokenizer=True, spec="off", max_batch=8)  # as a stand-in engine "loads" it


class StandInProcess:
    def __init__(self):
        self.exitcode = None

    def is_alive(self):
        return self.exitcode is None

    def join(self, timeout=None):
        self.exitcode = 0  # as if it obeyed Shutdown

    def kill(self):
        self.exitcode = -signal.SIGKILL


class StandInEngine:
    """Spawns EngineProcess objects whose queues the test reads and fills."""

    def __init__(self):
        self.spawned: list[EngineProcess] = []

    def __call__(self) -> EngineProcess:
        engine = EngineProcess(StandInProcess(), queue.Queue(), queue.Queue())
        self.spawned.append(engine)
        return engine


def test_exit_codes_in_words():
    assert exit_reason(-signal.SIGKILL) == "the engine was killed (out of memory?)"
    assert exit_reason(-signal.SIGSEGV) == "the engine crashed (segmentation fault)"
    assert exit_reason(-signal.SIGUSR1) == "the engine was stopped by SIGUSR1"
    assert exit_reason(3) == "the engine exited with code 3"


def test_events_arrive_as_signals_with_tokens_batched_per_frame(qtbot):
    spawn = StandInEngine()
    client = EngineClient(spawn)
    client.load(LoadModel("/model"))
    engine = spawn.spawned[0]
    assert engine.requests.get_nowait() == LoadModel("/model")
    request_id = client.generate(Generate(0, 10, token_ids=[1]))
    assert engine.requests.get_nowait().request_id == request_id == 1

    batches, finished, stats = [], [], []
    client.tokens.connect(batches.append)
    client.finished.connect(finished.append)
    client.step_stats.connect(stats.append)
    engine.events.put(Loaded(INFO))
    with qtbot.waitSignal(client.loaded, timeout=2000):
        pass
    assert client.info == INFO
    for token in range(5):
        engine.events.put(Tokens([token], [("answer", str(token))], request_id))
    engine.events.put(StepStats(request_id, 5, 0.1, 1, 0, 0, 0.0, 0.0))
    engine.events.put(Tokens([5], [("answer", "5")], request_id))
    engine.events.put(Done(StopReason.LENGTH, None, request_id))
    qtbot.waitUntil(lambda: bool(finished), timeout=2000)
    assert [[t.token_ids[0] for t in batch] for batch in batches] == [[0, 1, 2, 3, 4], [5]]  # order kept
    assert len(stats) == 1 and finished[0].stop_reason == "length"
    client.shutdown()


def test_a_dead_engine_is_reported_after_its_last_events_and_restart_loads_again(qtbot):
    spawn = StandInEngine()
    client = EngineClient(spawn)
    client.load(LoadModel("/model", context=128))
    engine = spawn.spawned[0]
    errors, batches = [], []
    client.error.connect(errors.append)
    client.tokens.connect(batches.append)
    engine.events.put(Error(ErrorKind.OOM, "out of GPU memory", 4))
    engine.events.put(Tokens([9], [("answer", "x")], 4))
    engine.process.exitcode = -signal.SIGKILL
    with qtbot.waitSignal(client.died, timeout=2000) as died:
        pass
    assert died.args == ["the engine was killed (out of memory?)"]
    assert errors[0].kind == "oom" and batches[0][0].token_ids == [9]
    assert not client.running and client.info is None

    client.restart()
    assert len(spawn.spawned) == 2
    assert spawn.spawned[1].requests.get_nowait() == LoadModel("/model", context=128)
    client.shutdown()
