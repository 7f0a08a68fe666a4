"""One speculative step: draft → route-ahead prefetch → verify (one target pass) → accept → rewind."""

import torch

from app.engine.cuda_graph import graph_ready
from app.engine.runner import StepRunner
from app.engine.sampling import Sampler
from app.engine.spec.accept import accept_one_hot, accept_sampled
from app.engine.spec.drafter import Drafter, Proposal
from app.engine.spec.routing import prefetch_for_block


class Speculator:
    """A target model, its KV cache and a drafter, kept in step: after every step the target cache and
    the drafter's context hold exactly the committed tokens (the prompt and every emitted token but
    the last, which is the next step's anchor)."""

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
        """The prompt's last logits [V]; the drafter receives the features of every prompt position."""
        return self.runner.prefill(prompt_ids, self.capture, self.drafter.commit)

    def step(self, anchor: int, block_size: int) -> tuple[list[int], int]:
        """Verify `anchor` and block_size - 1 drafts in one pass (block_size 1: a plain decode step).
        Returns the emitted tokens (the kept drafts, then the target's own next token) and the number
        of drafts kept."""
        committed = self.cache.length
        proposal = self.drafter.propose(anchor, block_size - 1, self.sampler) if block_size > 1 else Proposal()
        block = [anchor, *proposal.tokens]
        prefetch_for_block(self.model, block)
        logits, features = self._target_pass(block)
        if proposal.probs is None:
            kept, token = accept_one_hot(proposal.tokens, logits, self.sampler)
        else:
            target_probs = self.sampler.probabilities(logits)
            kept, token = accept_sampled(proposal.tokens, proposal.probs, target_probs, self.sampler)
        self.cache.truncate(committed + kept + 1)
        self.drafter.commit(block[: kept + 1], features[: kept + 1])
        return [*proposal.tokens[:kept], token], kept

    def _target_pass(self, block: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [B, V] and captured features [B, F]. The features are copied out: the drafter keeps them past
        the next pass."""
        logits, features = self.runner.run(block, self.capture)
        return logits, features.clone()
