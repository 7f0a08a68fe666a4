"""The speculative loop on the tiny GPT-OSS with experts offloaded (3 slots of 32), float32 on CPU:
greedy output identical to plain decoding for many prompts, block sizes and acceptance rates; the
edge cases; exact rewinds of the target's and the drafter's caches; per-step events; the sampled path
against the target's exact distribution; route-ahead prefetch predicted before the verify."""

import pytest
import torch

from app.engine.generation.generate import generate
from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.runner.step_runner import StepRunner
from app.engine.spec.dflash import DFlashSpeculation
from app.engine.spec.generate import speculative_generate
from app.engine.spec.step import Speculator
from app.protocol.events import Done, Tokens
from tests.engine.spec.conftest import load_offloaded
from tests.engine.spec.test_accept import assert_rate, chi_square_p_value
from tests.fixtures.agreeing_drafter import AgreeingDrafter

NEW_TOKENS = 20
VOCAB = 384
GREEDY = SamplingParams()


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


PROMPTS = [prompt(1, 0), prompt(2, 1), prompt(9, 2), prompt(20, 3), prompt(37, 4)]


def run(events) -> tuple[list[int], list[Tokens], Done]:
    events = list(events)
    steps = [e for e in events if isinstance(e, Tokens)]
    return [t for e in steps for t in e.token_ids], steps, events[-1]


def plain(model, ids: list[int], count: int = NEW_TOKENS, stop_ids=(), capacity: int | None = None):
    runner = StepRunner(model, capacity or len(ids) + count)
    return run(generate(runner, ids, Sampler(SamplingParams(), model.device), count, list(stop_ids)))


@pytest.fixture(scope="module")
def references(resident_target):
    """Each prompt's greedy continuation without speculation, experts resident."""
    return {tuple(ids): plain(resident_target, ids)[0] for ids in PROMPTS}


def drafter_for(speculation, ids, reference, agreement, capacity):
    proposer = speculation.new_drafter(capacity)
    if agreement is None:  # the tiny drafter's own drafts: random weights, almost never kept
        return proposer
    return AgreeingDrafter(proposer, len(ids), reference, agreement, VOCAB, seed=len(ids))


def speculate(model, drafter, ids, count=NEW_TOKENS, block_size=None, stop_ids=(), capacity=None,
              sampling=GREEDY):
    runner = StepRunner(model, capacity or len(ids) + count)
    events = speculative_generate(runner, ids, Sampler(sampling, model.device), count, list(stop_ids),
                                  drafter, block_size)
    return (*run(events), runner.cache)


@pytest.mark.parametrize("agreement", [None, 0.5, 1.0], ids=["own-drafts", "half-agree", "all-agree"])
@pytest.mark.parametrize("block_size", [None, 1, 2, 3, 6], ids=lambda b: f"block-{b or 'cost-aware'}")
def test_greedy_speculation_emits_exactly_the_plain_tokens(block_size, agreement, offloaded_target, speculation,
                                                           references):
    kept = []
    for ids in PROMPTS:
        reference = references[tuple(ids)]
        drafter = drafter_for(speculation, ids, reference, agreement, len(ids) + NEW_TOKENS)
        tokens, _, done, _ = speculate(offloaded_target, drafter, ids, block_size=block_size)
        assert tokens == reference, f"prompt of {len(ids)} tokens"
        assert done.stop_reason == "length"
        sizes = done.stats.spec.block_sizes
        kept += done.stats.spec.accepted_per_step
        if block_size:
            assert sizes == forced_sizes(block_size, done.stats.spec.accepted_per_step)
        if agreement == 1.0:
            assert done.stats.spec.accepted_per_step == [size - 1 for size in sizes]  # every draft kept
    assert offloaded_target.experts.stats.misses > 0
    if agreement == 0.5 and block_size and block_size > 2:
        assert 0 in kept and max(kept) > 0


def forced_sizes(block_size: int, kept: list[int]) -> list[int]:
    """The forced block size, cut to the tokens still to come before each step."""
    sizes, emitted = [], 1
    for accepted in kept:
        sizes.append(min(block_size, NEW_TOKENS - emitted))
        emitted += accepted + 1
    return sizes


def test_a_stop_token_among_the_kept_drafts_ends_the_answer_there(offloaded_target, speculation, references):
    ids = PROMPTS[3]
    reference = references[tuple(ids)]
    stop = next(t for k, t in enumerate(reference) if k >= 2 and t not in reference[:k])
    drafter = drafter_for(speculation, ids, reference, 1.0, len(ids) + NEW_TOKENS)
    tokens, steps, done, _ = speculate(offloaded_target, drafter, ids, block_size=6, stop_ids=[stop])
    expected, _, plain_done = plain(offloaded_target, ids, stop_ids=[stop])
    assert tokens == expected == reference[: reference.index(stop) + 1]
    assert done.stop_reason == plain_done.stop_reason == "stop"
    last = steps[-1]
    assert last.token_ids[-1] == stop and last.drafted[-1]  # it came from a kept draft
    assert last.spec.accepted == 5 and len(last.token_ids) < 6  # the step kept more than it emitted


def test_max_new_tokens_inside_a_block_caps_that_block(offloaded_target, speculation, references):
    ids = PROMPTS[2]
    reference = references[tuple(ids)]
    drafter = drafter_for(speculation, ids, reference, 1.0, len(ids) + 4)
    tokens, _, done, _ = speculate(offloaded_target, drafter, ids, count=4, block_size=6)
    assert tokens == reference[:4]
    assert done.stop_reason == "length"
    assert done.stats.spec.block_sizes == [3]  # the prefill's token, then one block of 3


def test_a_full_context_ends_speculation_where_it_ends_plain_decoding(offloaded_target, speculation, references):
    ids = PROMPTS[2]
    reference = references[tuple(ids)]
    capacity = len(ids) + 7
    drafter = drafter_for(speculation, ids, reference, 1.0, capacity)
    tokens, _, done, _ = speculate(offloaded_target, drafter, ids, block_size=6, capacity=capacity)
    expected, _, plain_done = plain(offloaded_target, ids, capacity=capacity)
    assert tokens == expected == reference[:8]
    assert done.stop_reason == plain_done.stop_reason == "context"


def test_rewinds_leave_the_target_and_drafter_caches_as_one_pass_over_the_committed_tokens(
        offloaded_target, speculation, resident_target, references):
    ids = PROMPTS[4]
    reference = references[tuple(ids)]
    proposer = speculation.new_drafter(len(ids) + NEW_TOKENS + 1)  # room to flush its context below
    drafter = AgreeingDrafter(proposer, len(ids), reference, 0.6, VOCAB, seed=9)
    tokens, _, done, cache = speculate(offloaded_target, drafter, ids, block_size=4)
    kept = done.stats.spec.accepted_per_step
    assert 0 in kept and 3 in kept  # some blocks were cut short and rewound
    committed = ids + tokens[:-1]
    assert cache.length == len(committed)
    fresh, context = one_pass_caches(resident_target, speculation, proposer, committed, tokens[-1])
    for name, buffer in cache.buffers.items():
        assert (buffer[:, : len(committed)] - fresh.buffers[name]).abs().max() <= 1e-4, name
    assert proposer.context.length == len(committed)
    for name, buffer in proposer.context.buffers.items():
        assert (buffer[:, : len(committed)] - context.buffers[name]).abs().max() <= 1e-4, name


def one_pass_caches(target, speculation, proposer, committed: list[int], anchor: int):
    """-> (the target's KV cache, the drafter's context) after one pass over `committed`; first `proposer` takes in
    its pending context (a draft from `anchor`)."""
    with torch.inference_mode():
        fresh = target.new_kv_cache(len(committed))
        _, features = target.forward(torch.tensor(committed), fresh, capture=proposer.target_layers)
        proposer.propose(anchor, 1, Sampler(SamplingParams(), torch.device("cpu")))
        context = speculation.drafter.new_context_cache(len(committed))
        speculation.drafter.add_context(features, context)
    return fresh, context


def test_each_step_reports_its_block_and_which_tokens_were_drafts(offloaded_target, speculation, references):
    ids = PROMPTS[3]
    reference = references[tuple(ids)]
    drafter = drafter_for(speculation, ids, reference, 0.6, len(ids) + NEW_TOKENS)
    tokens, steps, done, _ = speculate(offloaded_target, drafter, ids, block_size=4)
    spec = done.stats.spec
    assert steps[0].spec is None and steps[0].drafted == []  # the prefill's token
    assert spec.policy == "fixed"
    assert spec.steps == len(spec.block_sizes) == len(spec.accepted_per_step) == len(steps) - 1
    assert spec.mean_accepted == pytest.approx(sum(spec.accepted_per_step) / spec.steps)
    assert done.stats.decode_tokens == len(tokens) - 1 == sum(len(s.token_ids) for s in steps[1:])
    for step, size, kept in zip(steps[1:], spec.block_sizes, spec.accepted_per_step, strict=True):
        assert (step.spec.block_size, step.spec.accepted) == (size, kept)
        assert step.drafted == [i < kept for i in range(len(step.token_ids))]
        assert len(step.token_ids) == kept + 1 or step is steps[-1]
        assert step.spec.hits + step.spec.misses > 0
        assert step.spec.experts_per_layer == (step.spec.hits + step.spec.misses) / 4
    assert {"prefill_tokens", "decode_tokens", "ttft_s", "decode_tok_s", "expert_cache"} <= done.stats.as_dict().keys()


def test_sampled_speculation_emits_the_targets_own_distribution(resident_target, tiny_dflash):
    """Repeat one step from the same state: its first token must follow the target's distribution at
    that position, and the first draft is kept with probability 1 − TV(target, drafter)."""
    model, ids, anchor, trials = resident_target, PROMPTS[3], 17, 800
    speculation = DFlashSpeculation(tiny_dflash, None)
    speculation.load(model)
    sampler = Sampler(SamplingParams(temperature=1.5, top_k=12, seed=4), model.device)
    runner = StepRunner(model, 64)
    cache = runner.cache
    proposer = speculation.new_drafter(64)
    first, kept_first = [], 0
    with torch.inference_mode():
        speculator = Speculator(runner, proposer, sampler)
        speculator.prefill(ids)
        p = sampler.probabilities(model.forward(torch.tensor([anchor]), cache)[0])
        cache.truncate(len(ids))
        q = proposer.propose(anchor, 1, sampler).probs[0]
        for _ in range(trials):
            tokens, kept = speculator.step(anchor, 2)
            first.append(tokens[0])
            kept_first += kept
            cache.truncate(len(ids))  # back to the same state: the step's committed rows are dropped
            proposer.pending.clear()
    overlap = float(torch.minimum(p, q).sum())
    assert overlap > 0.05  # the drafter's top-k meets the target's: acceptance is tested, not just rejection
    assert chi_square_p_value(first, p) > 1e-3
    assert_rate(kept_first, trials, overlap)


def test_seeded_sampled_speculation_repeats(offloaded_target, speculation):
    ids = PROMPTS[2]
    sampling = SamplingParams(temperature=0.9, top_p=0.9, seed=21)
    first = speculate(offloaded_target, speculation.new_drafter(64), ids, block_size=3, sampling=sampling)[0]
    again = speculate(offloaded_target, speculation.new_drafter(64), ids, block_size=3, sampling=sampling)[0]
    assert first == again and len(first) == NEW_TOKENS


def test_route_ahead_prefetch_predicts_the_first_layer_before_each_verify(tiny_gpt_oss, tiny_dflash, resident_target,
                                                                        references, monkeypatch):
    """Layer 0 can only be predicted before the pass: by its router on the block's normed embeddings.
    Every such prediction must be made before its pass, and coverage / waste must be neither 0 nor 1."""
    target = load_offloaded(tiny_gpt_oss, slots=6, prefetch_layers=1).model
    speculation = DFlashSpeculation(tiny_dflash, None)
    speculation.load(target)
    ids = PROMPTS[3]
    reference = references[tuple(ids)]
    drafter = AgreeingDrafter(speculation.new_drafter(64), len(ids), reference, 0.7, VOCAB, seed=2)
    log = []
    prefetch, forward = target.experts.prefetch, target.forward
    monkeypatch.setattr(target.experts, "prefetch", lambda layer, experts: (log.append(("prefetch", layer, experts)),
                                                                            prefetch(layer, experts))[1])
    monkeypatch.setattr(target, "forward", lambda token_ids, *args, **kwargs: (log.append(("pass", token_ids.tolist())),
                                                                               forward(token_ids, *args, **kwargs))[1])
    tokens, steps, done, _ = speculate(target, drafter, ids, block_size=4)
    assert tokens == reference

    layer = resident_target.layers[0]
    passes = [i for i, entry in enumerate(log) if entry[0] == "pass"][1:]  # after the prefill
    for index in passes:
        block = log[index][1]
        kind, predicted_layer, predicted = log[index - 1]  # issued just before the pass
        embedded = resident_target.embed[torch.tensor(block)]
        normed = embedded * torch.rsqrt(embedded.pow(2).mean(-1, keepdim=True) + 1e-5) * layer["post_norm"]
        guess = (normed @ layer["router"].T + layer["router_bias"]).topk(2, dim=-1).indices
        assert (kind, predicted_layer) == ("prefetch", 0)
        assert predicted == sorted(set(guess.flatten().tolist()))
    cache_stats = done.stats.expert_cache
    assert 0 < cache_stats.prefetch_coverage < 1
    assert 0 < cache_stats.prefetch_waste < 1
    assert any(0 < step.spec.prefetch_coverage < 1 for step in steps[1:])
