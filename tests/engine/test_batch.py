"""Continuous batching against its oracle: each request decoded alone, as `moechat generate` does."""

import pytest

from app.engine.generation.batch import Batch
from app.engine.generation.sampling import SamplingParams
from app.engine.session import Session, collect
from app.protocol.events import Done, Tokens
from tests.test_cli_spec import budget_for_slots

CONTEXT = 80  # room for the four sequences' caches together
PROMPTS = {1: [5, 6, 7, 8, 9, 10], 2: [40, 41], 3: [100, 7, 250, 3, 9, 12, 13, 14, 15], 4: [300, 301, 302]}
MAX_NEW = {1: 12, 2: 20, 3: 7, 4: 16}


@pytest.fixture(scope="module")
def offloaded_session(tiny_gpt_oss):
    session = Session.load(tiny_gpt_oss, context=CONTEXT, dtype="float32",
                           gpu_budget=budget_for_slots(tiny_gpt_oss, 3, CONTEXT))
    assert session.loaded.model.experts.num_slots == 3
    return session


def test_concurrent_greedy_requests_give_the_tokens_of_sequential_runs(tiny_gpt_oss, offloaded_session, monkeypatch):
    batch = Batch(offloaded_session, max_sequences=4)
    experts = offloaded_session.loaded.model.experts
    sweeps, run = [], experts.run

    def counted_run(layer, *args, **kwargs):
        sweeps.append(layer)
        return run(layer, *args, **kwargs)

    monkeypatch.setattr(experts, "run", counted_run)
    events = batch.join(1, PROMPTS[1], SamplingParams(), MAX_NEW[1]) + batch.join(2, PROMPTS[2], SamplingParams(),
                                                                                  MAX_NEW[2])
    events += batch.step()
    events += batch.join(3, PROMPTS[3], SamplingParams(), MAX_NEW[3])  # joins between steps
    sweeps.clear()
    events += batch.step()
    assert sweeps == list(experts.store.layers)  # one expert sweep per layer for all three sequences
    events += batch.join(4, PROMPTS[4], SamplingParams(), MAX_NEW[4])
    while batch.sequences:
        events += batch.step()

    resident = Session.load(tiny_gpt_oss, context=CONTEXT, dtype="float32")  # as `moechat generate` runs it
    for request_id, prompt in PROMPTS.items():
        alone = collect(resident.generate(prompt, SamplingParams(), MAX_NEW[request_id]))
        tokens = [t for e in events if isinstance(e, Tokens) and e.request_id == request_id for t in e.token_ids]
        done = next(e for e in events if isinstance(e, Done) and e.request_id == request_id)
        assert tokens == alone["token_ids"], request_id
        assert done.stop_reason == alone["stop_reason"]
        assert done.stats.prefill_tokens == len(prompt)
        assert done.stats.decode_tokens == len(tokens) - 1
    stats = {e.request_id: e.stats for e in events if isinstance(e, Done)}
    assert stats[3].batch.mean_size > 1
    assert all(s.expert_cache.misses > 0 for s in stats.values())


def test_a_sequence_leaves_at_once_and_the_others_go_on(offloaded_session):
    batch = Batch(offloaded_session, max_sequences=2)
    batch.join(1, PROMPTS[1], SamplingParams(), 30)
    batch.join(2, PROMPTS[2], SamplingParams(temperature=0.9, seed=4), 30)
    assert not batch.has_room(1)  # two sequences, the most it takes
    batch.step()
    assert batch.leave(1).decode_tokens == 1 and batch.leave(1) is None
    events = batch.step()
    assert {e.request_id for e in events} == {2}
    assert batch.has_room(CONTEXT - 32) and not batch.has_room(CONTEXT - 31)  # 2 + 30 tokens reserved


def test_a_seeded_sampled_request_does_not_depend_on_its_neighbours(offloaded_session):
    def tokens_of(request_id: int, batch: Batch, events: list) -> list[int]:
        while batch.sequences:
            events += batch.step()
        return [t for e in events if isinstance(e, Tokens) and e.request_id == request_id for t in e.token_ids]

    sampled = SamplingParams(temperature=1.0, seed=11)
    alone = Batch(offloaded_session, max_sequences=4)
    alone_tokens = tokens_of(7, alone, alone.join(7, PROMPTS[3], sampled, 10))
    crowded = Batch(offloaded_session, max_sequences=4)
    events = crowded.join(8, PROMPTS[1], SamplingParams(temperature=1.0, seed=1), 10)
    events += crowded.join(7, PROMPTS[3], sampled, 10)
    assert tokens_of(7, crowded, events) == alone_tokens


@pytest.mark.parametrize("variant", ["glm4_moe", "glm4_moe_lite", "glm_moe_dsa"])
def test_glm_sequences_decoded_together_give_the_tokens_of_each_alone(variant, tiny_glm):
    folder = tiny_glm(variant)
    session = Session.load(folder, context=CONTEXT, dtype="float32", gpu_budget=budget_for_slots(folder, 4, CONTEXT))
    assert session.loaded.model.experts.num_slots == 4
    prompts = {1: [5, 6, 7, 8], 2: [40, 41], 3: [100, 7, 25, 3, 9, 12]}
    batch = Batch(session, max_sequences=3)
    events = [e for request_id, prompt in prompts.items() for e in batch.join(request_id, prompt, SamplingParams(), 8)]
    while batch.sequences:
        events += batch.step()
    for request_id, prompt in prompts.items():
        alone = collect(session.generate(prompt, SamplingParams(), 8))
        assert [t for e in events if isinstance(e, Tokens) and e.request_id == request_id
                for t in e.token_ids] == alone["token_ids"], request_id


@pytest.mark.parametrize("block_size", [4, None], ids=["fixed-blocks", "cost-aware"])
def test_speculative_sequences_decoded_together_give_the_tokens_of_each_alone(tiny_gpt_oss, tiny_dflash, block_size,
                                                                               monkeypatch):
    from app.engine.spec.options import SpecOptions

    session = Session.load(tiny_gpt_oss, SpecOptions("dflash", str(tiny_dflash), block_size), context=CONTEXT,
                           dtype="float32", gpu_budget=budget_for_slots(tiny_gpt_oss, 3, CONTEXT + 200))
    batch = Batch(session, max_sequences=3)
    experts = session.loaded.model.experts
    sweeps, run = [], experts.run

    def counted_run(layer, *args, **kwargs):
        sweeps.append(layer)
        return run(layer, *args, **kwargs)

    prompts = {1: PROMPTS[1], 2: PROMPTS[2], 3: PROMPTS[4]}
    events = [e for request_id, prompt in prompts.items() for e in batch.join(request_id, prompt, SamplingParams(), 12)]
    monkeypatch.setattr(experts, "run", counted_run)
    events += batch.step()
    assert sweeps == list(experts.store.layers)  # the three verify blocks shared one expert sweep
    monkeypatch.undo()
    while batch.sequences:
        events += batch.step()
    for request_id, prompt in prompts.items():
        alone = collect(session.generate(prompt, SamplingParams(), 12))
        done = next(e for e in events if isinstance(e, Done) and e.request_id == request_id)
        assert [t for e in events if isinstance(e, Tokens) and e.request_id == request_id
                for t in e.token_ids] == alone["token_ids"], request_id
        assert done.stats.spec.steps == len(done.stats.spec.block_sizes) > 0
        assert done.stats.batch.mean_size > 1
    assert max(len(step) for e in events if isinstance(e, Done) for step in [e.stats.spec.block_sizes]) > 0
    assert any(size > 1 for e in events if isinstance(e, Done) for size in e.stats.spec.block_sizes)
