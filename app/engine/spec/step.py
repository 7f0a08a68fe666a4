"""One speculative step: draft → route-ahead prefetch → verify (one target pass) → accept → rewind. A step
over several sequences drafts and accepts each, their verify blocks sharing one batched pass (the scheduler)."""

import torch

from app.engine.generation.sampling import Sampler
from app.engine.runner.cuda_graph import graph_ready
from app.engine.runner.step_runner import StepRunner
from app.engine.spec.accept import accept_one_hot, accept_sampled
from app.engine.spec.drafter import Drafter, Proposal
from app.engine.spec.routing import prefetch_for_block


class Speculator:
    """After every step the target cache and the drafter's context hold exactly the committed tokens (all but the
    last emitted, which is the next anchor)."""

    def __init__(self, runner: StepRunner, drafter: Drafter, sampler: Sampler):
        self.runner = runner
        self.model = runner.model
        self.cache = runner.cache
        self.drafter = drafter
        self.sampler = sampler
        self.capture = drafter.target_layers
        # every block size when passes are graphs (captured before the prefill: no step waits for one)
        runner.prepare(range(1, drafter.block_size + 1) if graph_ready(self.model) else [1], self.capture)

    def prefill(self, prompt_ids: list[int]) -> torch.Tensor:
        """-> the last logits [V]; the drafter receives the features of every prompt position."""
        return self.runner.prefill(prompt_ids, self.capture, self.drafter.commit)

    def step(self, anchor: int, block_size: int) -> tuple[list[int], int]:
        """One pass over `anchor` and block_size - 1 drafts -> (kept drafts then the target's token, drafts kept)."""
        block, proposal = self.draft(anchor, block_size)
        logits, features = self.runner.run(block, self.capture)
        # the features are copied out: the drafter keeps them past the next pass
        return self.accept(block, proposal, logits, features.clone())

    def draft(self, anchor: int, block_size: int) -> tuple[list[int], Proposal]:
        """-> ([anchor, *drafts], proposal); starts copying the block's first experts (route-ahead prefetch)."""
        proposal = self.drafter.propose(anchor, block_size - 1, self.sampler) if block_size > 1 else Proposal()
        block = [anchor, *proposal.tokens]
        prefetch_for_block(self.model, block)
        return block, proposal

    def accept(self, block: list[int], proposal: Proposal, logits: torch.Tensor,
               features: torch.Tensor) -> tuple[list[int], int]:
        """After the pass over `block`: logits [B, V], features [B, F]; rewinds cache and drafter to what is kept."""
        if proposal.probs is None:
            kept, token = accept_one_hot(proposal.tokens, logits, self.sampler)
        else:
            target_probs = self.sampler.probabilities(logits)
            kept, token = accept_sampled(proposal.tokens, proposal.probs, target_probs, self.sampler)
        self.cache.truncate(self.cache.length - len(block) + kept + 1)
        self.drafter.commit(block[: kept + 1], features[: kept + 1])
        return [*proposal.tokens[:kept], token], kept
