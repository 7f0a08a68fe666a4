"""A speculative sequence alone over a complete expert cache runs the plain steps its policy holds one ahead of
the host, like a plain sequence (ahead.py), against two oracles: plain decoding's tokens and the same speculative
generation with every step waiting for its token. Steps are timed by the test (a verify costs more than its
tokens win), so the policy's decisions are the same in both runs."""

import pytest

from app.engine.generation.ahead import AheadPass
from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.runner.step_runner import StepRunner
from app.engine.spec.dflash import DFlashSpeculation
from app.engine.spec.generate import speculative_generate
from app.engine.spec.sizer import PROBE_AFTER, BlockSizer
from tests.engine.spec.test_speculative_generate import PROMPTS, VOCAB, one_pass_caches, plain, run
from tests.fixtures.agreeing_drafter import AgreeingDrafter

NEW_TOKENS = PROBE_AFTER + 16  # past the first probe


@pytest.fixture(scope="module")
def speculation(resident_target, tiny_dflash):
    loaded = DFlashSpeculation(tiny_dflash, None)
    loaded.load(resident_target)
    return loaded


@pytest.fixture(autouse=True)
def test_clock(monkeypatch):
    """A plain step 10 ms, a verify 15: with drafts seldom kept the policy holds plain steps."""
    record = BlockSizer.record
    monkeypatch.setattr(BlockSizer, "record", lambda sizer, size, accepted, seconds, fetched:
                        record(sizer, size, accepted, 0.010 if size == 1 else 0.015, fetched))


@pytest.fixture(scope="module")
def references(resident_target):
    """Each prompt's greedy continuation without speculation."""
    return {tuple(ids): plain(resident_target, ids, NEW_TOKENS)[0] for ids in PROMPTS[2:4]}


def speculate(model, speculation, ids, reference, agreement, run_ahead=True, stop_ids=()):
    """-> tokens, Tokens events, Done, the runner's cache, the drafter."""
    capacity = len(ids) + NEW_TOKENS + 1  # room to flush the drafter's context after
    drafter = AgreeingDrafter(speculation.new_drafter(capacity), len(ids), reference, agreement, VOCAB, seed=5)
    runner = StepRunner(model, capacity, run_ahead)
    events = speculative_generate(runner, ids, Sampler(SamplingParams(), model.device), NEW_TOKENS,
                                  list(stop_ids), drafter)
    return (*run(events), runner.cache, drafter)


@pytest.fixture
def reads(monkeypatch):
    """At each read of a token ahead: how many passes were queued after the one read (1: ran ahead)."""
    queued_after = []
    init, read = AheadPass.__init__, AheadPass.read

    def queue(ahead, runner, *args):
        init(ahead, runner, *args)
        ahead.cache, ahead.length = runner.cache, runner.cache.length

    monkeypatch.setattr(AheadPass, "__init__", queue)
    monkeypatch.setattr(AheadPass, "read", lambda ahead: queued_after.append(ahead.cache.length - ahead.length)
                        or read(ahead))
    return queued_after


@pytest.mark.parametrize("agreement", [0.0, 0.2])
def test_held_plain_steps_run_ahead_and_change_nothing(resident_target, speculation, references, agreement, reads):
    ids = PROMPTS[2]
    reference = references[tuple(ids)]
    tokens, steps, done, _, _ = speculate(resident_target, speculation, ids, reference, agreement)
    in_turn = speculate(resident_target, speculation, ids, reference, agreement, run_ahead=False)
    assert tokens == reference == in_turn[0]
    assert [step.spec for step in steps] == [step.spec for step in in_turn[1]]  # the same blocks, hits, kept
    assert done.stats.spec.block_sizes == in_turn[2].stats.spec.block_sizes
    sizes = done.stats.spec.block_sizes
    assert sizes.count(1) > NEW_TOKENS / 2 and max(sizes[PROBE_AFTER:]) > 1  # held plain, then a probe
    assert reads.count(1) > sizes.count(1) / 2  # most plain steps were read with the next pass queued


def test_features_of_steps_run_ahead_reach_the_drafter(resident_target, speculation, references, reads):
    """After the answer the drafter's context is the one a single pass over the committed tokens builds."""
    ids = PROMPTS[3]
    tokens, _, done, cache, drafter = speculate(resident_target, speculation, ids, references[tuple(ids)], 0.2)
    assert reads.count(1) > PROBE_AFTER / 2
    assert max(done.stats.spec.block_sizes[PROBE_AFTER:]) > 1  # the probe's draft used the context built ahead
    proposer = drafter.inner
    committed = ids + tokens[:-1]
    assert cache.length == len(committed)
    _, context = one_pass_caches(resident_target, speculation, proposer, committed, tokens[-1])
    assert proposer.context.length == len(committed)
    for name, buffer in proposer.context.buffers.items():
        assert (buffer[:, : len(committed)] - context.buffers[name]).abs().max() <= 1e-4, name


def test_a_stop_token_in_a_plain_streak_drops_the_pass_queued_after_it(resident_target, speculation, references,
                                                                        reads):
    ids = PROMPTS[2]
    reference = references[tuple(ids)]
    stop = next(token for k, token in enumerate(reference) if k >= 12 and token not in reference[:k])
    tokens, steps, done, cache, _ = speculate(resident_target, speculation, ids, reference, 0.0, stop_ids=[stop])
    assert tokens == reference[: reference.index(stop) + 1] and done.stop_reason == "stop"
    assert reads[-1] == 1 and steps[-1].spec.block_size == 1  # read with the pass after it queued
    assert cache.length == len(ids) + len(tokens) - 1
