"""The engine process's loop: several generations in flight by id, each cancellable on its own."""

import queue

from app.engine.generation.sampling import SamplingParams
from app.engine.process import engine_main
from app.engine.session import Session, collect
from app.protocol.events import Done, Error, Loaded, Tokens
from app.protocol.requests import Cancel, Generate, LoadModel, Shutdown


class Recorder:
    """The events queue: records events and lets a test react to them from inside the engine's loop."""

    def __init__(self, requests: queue.Queue, react):
        self.events, self.requests, self.react = [], requests, react

    def put(self, event) -> None:
        self.events.append(event)
        self.react(self, event)

    def tokens(self, request_id: int) -> list[int]:
        return [t for e in self.events if isinstance(e, Tokens) and e.request_id == request_id for t in e.token_ids]

    def done(self, request_id: int) -> Done:
        return next(e for e in self.events if isinstance(e, Done) and e.request_id == request_id)


def run_engine(requests: list, react, expected_done: int, expected_errors: int = 0) -> Recorder:
    """engine_main on in-process queues, until as many generations have ended (with Done or Error) as
    `expected_done` and `expected_errors` say."""
    inbox = queue.Queue()

    def react_then_stop(recorder: Recorder, event) -> None:
        react(recorder, event)
        ended = sum(isinstance(e, Done | Error) for e in recorder.events)
        if isinstance(event, Done | Error) and ended == expected_done + expected_errors:
            inbox.put(Shutdown())

    recorder = Recorder(inbox, react_then_stop)
    for request in requests:
        inbox.put(request)
    engine_main(inbox, recorder)
    return recorder


def test_a_cancelled_generation_leaves_before_the_next_step_and_the_other_goes_on(tiny_gpt_oss):
    def cancel_after_three(recorder: Recorder, event) -> None:
        if isinstance(event, Tokens) and event.request_id == 2 and len(recorder.tokens(2)) == 3:
            recorder.requests.put(Cancel(2))

    recorder = run_engine([LoadModel(str(tiny_gpt_oss), context=80), Generate(1, 20, token_ids=[5, 6, 7]),
                           Generate(2, 40, token_ids=[9, 8, 7, 6])], cancel_after_three, expected_done=2)
    assert next(e for e in recorder.events if isinstance(e, Loaded)).info.max_batch == 8
    assert len(recorder.tokens(2)) == 3 and recorder.done(2).stop_reason == "cancelled"
    assert recorder.done(2).stats.decode_tokens == 2 and recorder.done(2).stats.prefill_tokens == 4
    session = Session.load(tiny_gpt_oss, context=80, dtype="float32")
    alone = collect(session.generate([5, 6, 7], SamplingParams(), 20))
    assert recorder.tokens(1) == alone["token_ids"]
    assert recorder.done(1).stop_reason == alone["stop_reason"]
    assert recorder.done(1).stats.batch.mean_size > 1  # they shared steps


def test_a_waiting_generation_can_be_cancelled_before_it_starts(tiny_gpt_oss):
    def cancel_the_waiting_one(recorder: Recorder, event) -> None:
        if isinstance(event, Tokens) and event.request_id == 1 and len(recorder.tokens(1)) == 1:
            recorder.requests.put(Cancel(2))

    recorder = run_engine([LoadModel(str(tiny_gpt_oss), context=64, max_batch=1),
                           Generate(1, 5, token_ids=[5, 6, 7]), Generate(2, 5, token_ids=[9, 8]),
                           Generate(3, 5, token_ids=[10, 11])], cancel_the_waiting_one, expected_done=3)
    assert recorder.tokens(2) == [] and recorder.done(2).stop_reason == "cancelled"
    ends = [e.request_id for e in recorder.events if isinstance(e, Done)]
    assert ends == [2, 1, 3]  # one at a time with max_batch 1; 3 started after 1 ended
    assert len(recorder.tokens(3)) == 5


def test_cancel_without_an_id_stops_every_generation(tiny_gpt_oss):
    def cancel_all(recorder: Recorder, event) -> None:
        if isinstance(event, Tokens) and len(recorder.tokens(1)) == 2 and event.request_id == 1:
            recorder.requests.put(Cancel())

    recorder = run_engine([LoadModel(str(tiny_gpt_oss), context=64), Generate(1, 30, token_ids=[5, 6, 7]),
                           Generate(2, 30, token_ids=[9, 8])], cancel_all, expected_done=2)
    assert {recorder.done(1).stop_reason, recorder.done(2).stop_reason} == {"cancelled"}
    assert len(recorder.tokens(1)) == 2


def test_a_generation_waits_while_the_running_ones_hold_the_planned_kv_cache(tiny_gpt_oss):
    recorder = run_engine([LoadModel(str(tiny_gpt_oss), context=40), Generate(1, 17, token_ids=[5, 6, 7]),
                           Generate(2, 20, token_ids=[9, 8]), Generate(3, 3, token_ids=[10, 11])],
                          lambda recorder, event: None, expected_done=3)
    # 1 holds 20 tokens of the 40; 2 needs 22, so it waits for 1 to end, and 3 (arrived later) behind it
    ends = [e.request_id for e in recorder.events if isinstance(e, Done)]
    assert ends == [1, 3, 2]
    assert recorder.done(1).stats.batch.mean_size == 1
    assert recorder.done(3).stats.batch.mean_size == 2
