"""`--spec mtp` on tiny GLMs (GQA, and MLA with DSA) with their MTP layer, experts offloaded: greedy
output identical to plain decoding, and the MTP layer's own cache rewound exactly."""

import pytest
import torch

from app.engine.generation.generate import generate
from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.runner.step_runner import StepRunner
from app.engine.spec.generate import speculative_generate
from app.engine.spec.mtp import MtpProposer, MtpSpeculation
from app.protocol.events import Tokens
from tests.engine.spec.conftest import load_offloaded
from tests.fixtures.agreeing_drafter import AgreeingDrafter

NEW_TOKENS = 16
PROMPTS = [[7], list(range(20, 29)), torch.randint(6, 384, (21,), generator=torch.Generator().manual_seed(5)).tolist()]
GREEDY = SamplingParams()


@pytest.fixture(scope="module", params=["glm4_moe", "glm_moe_dsa"])
def glm(request, tiny_glm):
    """(offloaded model with 4 expert slots, its MTP speculation, each prompt's plain greedy continuation)."""
    loaded = load_offloaded(tiny_glm(request.param), slots=4, prefetch_layers=1)
    model = loaded.model
    speculation = MtpSpeculation(loaded.facts, None)
    speculation.load(model)
    references = {}
    for ids in PROMPTS:
        events = generate(StepRunner(model, 64), ids, Sampler(GREEDY, model.device), NEW_TOKENS, [])
        references[tuple(ids)] = [t for e in events if isinstance(e, Tokens) for t in e.token_ids]
    return model, speculation, references


def tokens_and_stats(model, ids, drafter, block_size):
    events = list(speculative_generate(StepRunner(model, 64), ids, Sampler(GREEDY, model.device),
                                       NEW_TOKENS, [], drafter, block_size))
    return [t for e in events if isinstance(e, Tokens) for t in e.token_ids], events[-1].stats


@pytest.mark.parametrize("agreement", [None, 0.7], ids=["own-drafts", "agree-0.7"])
@pytest.mark.parametrize("block_size", [None, 2, 4], ids=lambda b: f"block-{b or 'cost-aware'}")
def test_greedy_mtp_speculation_emits_exactly_the_plain_tokens(glm, block_size, agreement):
    model, speculation, references = glm
    kept = []
    for ids in PROMPTS:
        reference = references[tuple(ids)]
        drafter = speculation.new_drafter(64)
        if agreement is not None:
            drafter = AgreeingDrafter(drafter, len(ids), reference, agreement, 384, seed=len(ids))
        tokens, stats = tokens_and_stats(model, ids, drafter, block_size)
        assert tokens == reference, f"prompt of {len(ids)} tokens"
        kept += stats.spec.accepted_per_step
    assert model.experts.stats.misses > 0
    if agreement is not None and block_size != 2:
        assert 0 in kept and max(kept) >= 2


def test_the_mtp_cache_after_rewinds_is_the_one_a_single_pass_builds(glm):
    model, speculation, references = glm
    ids = PROMPTS[2]
    reference = references[tuple(ids)]
    proposer = MtpProposer(speculation.mtp, 64, block_size=4)
    tokens, stats = tokens_and_stats(model, ids, AgreeingDrafter(proposer, len(ids), reference, 0.6, 384, seed=3), 4)
    assert tokens == reference
    assert 0 in stats.spec.accepted_per_step and 3 in stats.spec.accepted_per_step
    committed = ids + tokens[:-1]
    with torch.inference_mode():
        drafts = proposer.propose(tokens[-1], 3, Sampler(GREEDY, model.device))
        _, hidden = model.forward(torch.tensor(committed), model.new_kv_cache(64), capture=proposer.target_layers)
        fresh = MtpProposer(speculation.mtp, 64, block_size=4)
        fresh.commit(committed, hidden)
        fresh_drafts = fresh.propose(tokens[-1], 3, Sampler(GREEDY, model.device))
    assert proposer.cache.length == fresh.cache.length == len(committed)
    for name, buffer in proposer.cache.buffers.items():
        rows = fresh.cache.buffers[name][:, : len(committed)]
        assert (buffer[:, : len(committed)] - rows).abs().max() <= 1e-4, name
    assert drafts.tokens == fresh_drafts.tokens
