"""DFlash speculation: the drafter set up next to a target (`DFlashSpeculation`) and serving one
generation (`DFlashProposer`). `DFlashDrafter` in models/dflash.py holds the weights and the math."""

from pathlib import Path

import torch

from app.engine.checkpoint import Checkpoint
from app.engine.models.dflash import DFlashDrafter, check_pairing, open_dflash
from app.engine.sampling import Sampler
from app.engine.spec.drafter import Proposal
from app.errors import UserError
from app.plan import PREFILL_CHUNK
from app.sizes import format_size


class DFlashSpeculation:
    """The drafter's folder is read before the target loads, so that its bytes come out of the GPU
    budget; its weights load after, onto the target's device, once the pair is checked."""

    def __init__(self, path: str | Path, block_size: int | None):
        self.folder, self.config = open_dflash(path)
        if block_size is not None and block_size > self.config.block_size:
            raise UserError(f"--block-size {block_size} is larger than the drafter's block size "
                            f"{self.config.block_size}")
        self.block_size = block_size
        self.drafter: DFlashDrafter | None = None

    def budget_left(self, gpu_budget: int | None, context: int, dtype: str) -> int | None:
        """The GPU budget that remains for the target once the drafter's weights and context cache
        are set aside."""
        if gpu_budget is None:
            return None
        needed = self.config.device_bytes(self.folder, context, dtype)
        if needed >= gpu_budget:
            raise UserError(f"GPU budget {format_size(gpu_budget)} is too small: the drafter alone needs "
                            f"{format_size(needed)}; raise --gpu-budget")
        return gpu_budget - needed

    def load(self, model) -> None:
        check_pairing(self.config, model.config)
        self.drafter = DFlashDrafter(self.config, Checkpoint(self.folder), model)

    def new_drafter(self, capacity: int) -> "DFlashProposer":
        return DFlashProposer(self.drafter, capacity)


class DFlashProposer:
    """Committed features wait until the next draft needs them (plain steps then cost no drafter work),
    or until a prefill chunk's worth has gathered."""

    def __init__(self, drafter: DFlashDrafter, capacity: int):
        self.drafter = drafter
        self.block_size = drafter.config.block_size
        self.target_layers = drafter.config.target_layer_ids
        self.context = drafter.new_context_cache(capacity)
        self.pending: list[torch.Tensor] = []
        self.pending_rows = 0

    def commit(self, token_ids: list[int], features: torch.Tensor) -> None:
        self.pending.append(features)
        self.pending_rows += len(features)
        if self.pending_rows >= PREFILL_CHUNK:
            self._add_pending()

    def propose(self, anchor: int, count: int, sampler: Sampler) -> Proposal:
        """Drafts are the drafter's argmax when decoding greedily, else drawn from its distribution
        under the same sampling parameters as the target's."""
        self._add_pending()
        block = torch.full((count + 1,), self.drafter.config.mask_token_id, device=self.drafter.device)
        block[0] = anchor
        logits = self.drafter.draft(block, self.context)
        if sampler.params.greedy:
            return Proposal(logits.argmax(-1).tolist())
        probs = sampler.probabilities(logits)
        return Proposal(sampler.draw(probs), probs)

    def _add_pending(self) -> None:
        if self.pending:
            self.drafter.add_context(torch.cat(self.pending), self.context)
            self.pending, self.pending_rows = [], 0
