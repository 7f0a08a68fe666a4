"""The engine server behind the queues, driven directly and as a real spawned process."""

import json

from app.engine import process
from app.engine.generation.sampling import SamplingParams
from app.engine.process import EngineServer
from app.engine.session import Prompt, Session, collect
from app.protocol.engine_process import spawn_engine
from app.protocol.events import Done, Error, Loaded, LoadProgress, StepStats, Tokens
from app.protocol.requests import Generate, LoadModel
from app.protocol.stats import CacheStats
from tests.fixtures.tiny_dflash import write_tiny_dflash
from tests.test_cli_spec import CONTEXT, budget_for_slots


def serve(requests, cancel_after_tokens: int | None = None) -> list:
    events = []

    def cancel_requested() -> bool:
        produced = sum(len(e.token_ids) for e in events if isinstance(e, Tokens))
        return cancel_after_tokens is not None and produced >= cancel_after_tokens

    server = EngineServer(events.append, cancel_requested)
    for request in requests:
        server.handle(request)
        while server.busy:
            server.step()
    return events


def test_load_then_generate_streams_tokens_like_a_direct_session(tiny_gpt_oss):
    request = Generate(1, max_new_tokens=8, messages=[{"role": "user", "content": "hello"}])
    events = serve([LoadModel(str(tiny_gpt_oss), context=128), request])
    stages = [e.stage for e in events if isinstance(e, LoadProgress)]
    assert stages[0] == "planning" and stages[-1] == "ready" and "expert store" in stages
    loaded = next(e for e in events if isinstance(e, Loaded))
    assert loaded.info.model_type == "gpt_oss" and loaded.info.context == 128
    tokens = [t for e in events if isinstance(e, Tokens) for t in e.token_ids]
    done = events[-1]
    assert isinstance(done, Done) and done.request_id == 1
    session = Session.load(tiny_gpt_oss, context=128, dtype="float32")  # as LoadModel defaults
    ids = session.prompt_ids(Prompt(messages=[{"role": "user", "content": "hello"}]))
    expected = collect(session.generate(ids, SamplingParams(), 8))
    assert tokens == expected["token_ids"]


def test_cancel_stops_a_generation_between_steps(tiny_gpt_oss):
    events = serve([LoadModel(str(tiny_gpt_oss), context=128), Generate(2, 50, token_ids=[5, 6, 7])],
                   cancel_after_tokens=3)
    assert events[-1].stop_reason == "cancelled" and events[-1].request_id == 2
    assert sum(len(e.token_ids) for e in events if isinstance(e, Tokens)) == 3


def test_errors_are_events_with_one_readable_line(tiny_gpt_oss, tmp_path):
    events = serve([Generate(3, 5, token_ids=[1]), LoadModel(str(tmp_path / "nowhere")),
                    LoadModel(str(tiny_gpt_oss), context=16), Generate(4, 5, token_ids=list(range(3, 30)))])
    errors = [e for e in events if isinstance(e, Error)]
    assert [(e.kind, e.request_id) for e in errors] == [("request", 3), ("load", None), ("request", 4)]
    assert "no model is loaded" in errors[0].message
    assert "does not exist" in errors[1].message
    assert "the prompt has 27 tokens but the context holds 16" in errors[2].message


def test_a_spawned_engine_answers_and_shuts_down(tiny_gpt_oss):
    engine = spawn_engine()
    try:
        engine.send(LoadModel(str(tiny_gpt_oss), context=64))
        engine.send(Generate(7, max_new_tokens=5, token_ids=[10, 11, 12]))
        events = []
        while not events or not isinstance(events[-1], Done | Error):
            events.append(engine.events.get(timeout=120))
        assert isinstance(events[-1], Done), events[-1]
        assert events[-1].request_id == 7
        assert any(isinstance(e, Loaded) for e in events)
        assert 1 <= sum(len(e.token_ids) for e in events if isinstance(e, Tokens)) <= 5
    finally:
        engine.stop()
    assert engine.process.exitcode == 0


def test_a_load_with_dflash_speculates_and_keeps_the_greedy_tokens(tiny_gpt_oss, tiny_dflash):
    request = Generate(5, max_new_tokens=12, token_ids=[5, 6, 7, 8])
    plain = serve([LoadModel(str(tiny_gpt_oss), context=64), request])
    speculated = serve([LoadModel(str(tiny_gpt_oss), context=64, spec="dflash", drafter=str(tiny_dflash),
                                  block_size=3), request])
    assert next(e for e in speculated if isinstance(e, Loaded)).info.spec == "dflash"
    steps = [e for e in speculated if isinstance(e, Tokens) and e.spec is not None]
    assert steps and steps[0].spec.block_size == 3  # later steps may verify fewer near max_new_tokens
    assert all(e.spec.block_size <= 3 and len(e.drafted) == len(e.token_ids) for e in steps)
    assert sum(e.drafted.count(True) for e in steps) == sum(e.spec.accepted for e in steps)
    assert [t for e in speculated if isinstance(e, Tokens) for t in e.token_ids] == \
        [t for e in plain if isinstance(e, Tokens) for t in e.token_ids]
    assert speculated[-1].stats.spec.steps == len(steps)


def test_speculation_that_does_not_fit_is_a_load_error_in_words(tiny_gpt_oss, tiny_dflash, tmp_path):
    target_config = json.loads((tiny_gpt_oss / "config.json").read_text())
    narrow = write_tiny_dflash(tmp_path / "narrow", {**target_config, "hidden_size": 32})
    events = serve([LoadModel(str(tiny_gpt_oss), spec="dflash"),
                    LoadModel(str(tiny_gpt_oss), context=64, spec="dflash", drafter=str(narrow)),
                    LoadModel(str(tiny_gpt_oss), context=64, spec="dflash", drafter=str(tiny_dflash), block_size=7),
                    LoadModel(str(tiny_gpt_oss), context=64, spec="mtp")])
    errors = [e for e in events if isinstance(e, Error)]
    assert [e.kind for e in errors] == ["load"] * 4 and not any(isinstance(e, Loaded) for e in events)
    assert "needs the drafter's folder" in errors[0].message
    assert "trained for another model" in errors[1].message
    assert "larger than the drafter's block size 6" in errors[2].message
    assert "needs a model with its own MTP layer (GLM)" in errors[3].message


def test_step_stats_carry_the_share_of_each_layers_experts_in_the_cache(tiny_gpt_oss, monkeypatch):
    monkeypatch.setattr(process, "STATS_INTERVAL_S", 0.0)  # figures after every step
    events = []
    server = EngineServer(events.append, lambda: False)
    server.handle(LoadModel(str(tiny_gpt_oss), context=CONTEXT, gpu_budget=budget_for_slots(tiny_gpt_oss, 3)))
    server.handle(Generate(1, max_new_tokens=8, token_ids=[5, 6, 7, 8]))
    cache = server.session.loaded.model.experts
    resident = set()  # what the cache held when the last StepStats was sent (the final step sends none)
    while server.busy:
        reported = len(events)
        server.step()
        if any(isinstance(e, StepStats) for e in events[reported:]):
            resident = cache.resident()
    assert cache.num_slots == 3 and len(cache.store.layers) > 1
    stats = [e for e in events if isinstance(e, StepStats)]
    assert stats and all(len(s.residency) == len(cache.store.layers) for s in stats)
    expected = [sum(1 for layer, _ in resident if layer == moe_layer) / cache.store.num_experts
                for moe_layer in cache.store.layers]
    assert stats[-1].residency == expected and sum(expected) * cache.store.num_experts == 3


def test_step_stats_carry_the_misses_the_cpu_tier_computed():
    delta = CacheStats(hits=5, misses=7, bytes_fetched=3 << 20, cpu_computed=4)
    stats = process._step_stats(2, 3, 0.25, delta, [0.5])
    assert (stats.hits, stats.misses, stats.bytes_fetched, stats.cpu_computed) == (5, 7, 3 << 20, 4)


def test_a_load_passes_its_cpu_threads_to_the_loader(tiny_gpt_oss, threads_loaded):
    events = serve([LoadModel(str(tiny_gpt_oss), context=64, cpu_threads=1), LoadModel(str(tiny_gpt_oss), context=64)])
    assert threads_loaded == [1, 0] and sum(isinstance(e, Loaded) for e in events) == 2
