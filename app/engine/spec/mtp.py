"""MTP speculation: GLM's MTP layer (models/glm_mtp.py) drafts k tokens by running k times on its own output.
Cache row p needs the token at p + 1, so the last committed row waits for the next anchor; rows made while
drafting are dropped once the drafts are out.
"""

import torch

from app.engine.generation.sampling import Sampler
from app.engine.models.glm_mtp import GlmMtp
from app.engine.spec.drafter import Proposal
from app.errors import UserError
from app.plan import ModelFacts, dtype_bytes
from app.sizes import format_size

MTP_BLOCK_SIZE = 4  # the anchor and 3 drafts: acceptance falls fast after the first (speculation.md)


class MtpSpeculation:
    """Its bytes come out of the GPU budget before the target loads; the layer loads after, from its checkpoint."""

    def __init__(self, facts: ModelFacts, block_size: int | None):
        self.facts = facts
        self.block_size = block_size
        self.mtp: GlmMtp | None = None

    def budget_left(self, gpu_budget: int | None, context: int, dtype: str) -> int | None:
        if gpu_budget is None:
            return None
        per_value = dtype_bytes(dtype)
        cache = self.facts.kv_bytes_per_token(per_value) // self.facts.num_layers * context  # one layer's share
        needed = self.facts.mtp_weights * per_value + cache
        if needed >= gpu_budget:
            raise UserError(f"GPU budget {format_size(gpu_budget)} is too small: the MTP layer alone needs "
                            f"{format_size(needed)}; raise --gpu-budget")
        return gpu_budget - needed

    def load(self, model) -> None:
        self.mtp = model.load_mtp()
        if self.mtp is None:
            raise UserError(f"--spec mtp needs a model with its own MTP layer (GLM); "
                            f"this one is {self.facts.model_type}: use --spec dflash with a drafter")

    def new_drafter(self, capacity: int) -> "MtpProposer":
        return MtpProposer(self.mtp, capacity, self.block_size or MTP_BLOCK_SIZE)

    def release(self, proposer: "MtpProposer") -> None:
        """Nothing to give back: each generation's MTP cache goes with its proposer."""


class MtpProposer:
    """One generation's MTP layer; committed positions wait for the next anchor to complete their rows."""

    def __init__(self, mtp: GlmMtp, capacity: int, block_size: int):
        self.mtp = mtp
        self.block_size = block_size
        self.target_layers = (mtp.target.config.num_hidden_layers - 1,)  # its final, normed hidden states
        self.cache = mtp.new_kv_cache(capacity)
        self.tokens: list[int] = []
        self.hidden: list[torch.Tensor] = []

    def commit(self, token_ids: list[int], features: torch.Tensor) -> None:
        self.tokens += token_ids
        self.hidden.append(features)

    def propose(self, anchor: int, count: int, sampler: Sampler) -> Proposal:
        """Greedy: the layer's argmax; else drawn under the target's sampling parameters."""
        device = self.mtp.target.device
        next_tokens = torch.tensor([*self.tokens[1:], anchor], device=device)
        logits, hidden = self.mtp.draft(torch.cat(self.hidden), next_tokens, self.cache)
        self.tokens, self.hidden = [], []
        committed = self.cache.length
        drafts, probs = [], []
        for index in range(count):
            if sampler.params.greedy:
                drafts.append(int(logits[-1].argmax()))
            else:
                probs.append(sampler.probabilities(logits[-1]))
                drafts += sampler.draw(probs[-1][None])
            if index + 1 < count:
                logits, hidden = self.mtp.draft(hidden[-1:], torch.tensor(drafts[-1:], device=device), self.cache)
        self.cache.truncate(committed)
        return Proposal(drafts, torch.stack(probs) if probs else None)
