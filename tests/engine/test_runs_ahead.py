"""A lone plain sequence over a complete expert cache runs its passes one ahead of the host (ahead.py), against
its oracle: the same generation with every step waiting for its token (`runs_ahead` off)."""

import pytest

from app.engine.generation.ahead import AheadPass
from app.engine.generation.batch import Batch
from app.engine.generation.generate import generate
from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.runner.step_runner import StepRunner
from app.engine.session import Session, collect
from app.protocol.events import Done, Tokens
from app.protocol.kinds import StopReason

PROMPT = [5, 6, 7, 8, 9, 10]
CONTEXT = 64


@pytest.fixture(scope="module")
def session(tiny_gpt_oss):
    session = Session.load(tiny_gpt_oss, context=CONTEXT, dtype="float32")
    assert session.runner.runs_ahead  # every expert resident
    return session


def answer(session, sampling: SamplingParams, max_new: int, stop_ids: list[int] = (), prompt=PROMPT,
           run_ahead: bool = True) -> dict:
    """The answer, and the cache's length after it, with every step waiting for its token unless `run_ahead`."""
    runner = StepRunner(session.loaded.model, CONTEXT, run_ahead)
    model = session.loaded.model
    out = collect(generate(runner, prompt, Sampler(sampling, model.device), max_new, list(stop_ids)))
    untimed = {name: value for name, value in out["stats"].items() if name not in ("ttft_s", "decode_tok_s")}
    return {**out, "stats": untimed, "cache_length": runner.cache.length}


def in_turn(*args, **kwargs) -> dict:
    return answer(*args, **kwargs, run_ahead=False)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, top_k=40, seed=3)],
                         ids=["greedy", "seeded"])
def test_the_tokens_and_counts_of_steps_in_turn(session, monkeypatch, sampling):
    reads = []  # at each read of a token ahead: the tokens the cache holds
    read = AheadPass.read
    monkeypatch.setattr(AheadPass, "read", lambda ahead: reads.append(runner_lengths[-1]) or read(ahead))
    runner_lengths = []
    monkeypatch.setattr(StepRunner, "run_on_device", _recording(StepRunner.run_on_device, runner_lengths))
    ahead = answer(session, sampling, 12)
    assert ahead == in_turn(session, sampling, 12)
    assert ahead["stop_reason"] == StopReason.LENGTH and len(ahead["token_ids"]) == 12
    # each token but the last two was read after the pass from the token after it was queued
    assert reads[:-1] == [len(PROMPT) + n for n in range(2, 12)]
    assert ahead["stats"]["expert_cache"]["hits"] > 0


def _recording(run_on_device, lengths: list[int]):
    def recorded(runner, tokens, capture=()):
        out = run_on_device(runner, tokens, capture)
        lengths.append(runner.cache.length)
        return out

    return recorded


def test_a_stop_token_drops_the_pass_queued_after_it(session):
    tokens = answer(session, SamplingParams(), 16)["token_ids"]
    stop = next(token for i, token in enumerate(tokens) if i >= 3 and token not in tokens[:i])
    ahead = answer(session, SamplingParams(), 16, [stop])
    assert ahead["stop_reason"] == StopReason.STOP and ahead["token_ids"][-1] == stop
    assert ahead == in_turn(session, SamplingParams(), 16, [stop])  # the cache's length and counts included
    assert ahead["cache_length"] == len(PROMPT) + len(ahead["token_ids"]) - 1


def test_the_context_ends_it_with_no_pass_past_the_cache(session):
    prompt = list(range(3, 3 + CONTEXT - 5))
    ahead = answer(session, SamplingParams(), 50, prompt=prompt)
    assert ahead["stop_reason"] == StopReason.CONTEXT and ahead["cache_length"] == CONTEXT
    assert ahead == in_turn(session, SamplingParams(), 50, prompt=prompt)


def test_a_joining_sequence_finds_the_first_caught_up(session):
    alone = {request_id: collect(session.generate(prompt, SamplingParams(), 10))["token_ids"]
             for request_id, prompt in ((1, PROMPT), (2, [40, 41, 42]))}
    batch = Batch(session, max_sequences=2)
    events = batch.join(1, PROMPT, SamplingParams(), 10)
    events += batch.step() + batch.step()  # alone: a pass ahead is queued
    assert batch.sequences[1].ahead is not None
    joined = batch.join(2, [40, 41, 42], SamplingParams(), 10)
    assert [e.request_id for e in joined] == [1, 2]  # its token ahead first
    assert batch.sequences[1].ahead is None
    events += joined
    while batch.sequences:
        events += batch.step()
    for request_id, tokens in alone.items():
        assert [t for e in events if isinstance(e, Tokens) and e.request_id == request_id
                for t in e.token_ids] == tokens


def test_leaving_with_a_pass_ahead_frees_the_cache(session):
    batch = Batch(session, max_sequences=1)
    batch.join(1, PROMPT, SamplingParams(), 10)
    batch.step()
    assert batch.sequences[1].ahead is not None
    stats = batch.leave(1)
    assert stats.decode_tokens == 1 and not batch.sequences
    again = batch.join(2, PROMPT, SamplingParams(), 10)
    while batch.sequences:
        again += batch.step()
    done = next(e for e in again if isinstance(e, Done))
    assert [t for e in again if isinstance(e, Tokens) for t in e.token_ids] == \
        collect(session.generate(PROMPT, SamplingParams(), 10))["token_ids"]
    assert done.stats.decode_tokens == 9
