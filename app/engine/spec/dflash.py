"""DFlash speculation: the drafter set up next to a target (`DFlashSpeculation`) and serving one
generation (`DFlashProposer`). `DFlashDrafter` in models/dflash.py holds the weights and the math."""

from pathlib import Path

import torch

from app.engine.generation.sampling import Sampler
from app.engine.layers.kv_cache import KVCache
from app.engine.models.dflash import DFlashDrafter, check_pairing, open_dflash
from app.engine.runner.cuda_graph import PassGraph
from app.engine.spec.drafter import Proposal
from app.engine.weights.checkpoint import Checkpoint
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
        self._idle: list[tuple[KVCache, DraftGraphs | None]] = []  # contexts no generation holds

    def budget_left(self, gpu_budget: int | None, context: int, dtype: str) -> int | None:
        """What remains for the target after the drafter's weights and context cache."""
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
        """A released context (and its graphs) serves the next generation of the same capacity; one of another
        capacity is dropped, so kept contexts never outnumber the running generations."""
        idle = next((held for held in self._idle if held[0].capacity == capacity), None)
        if idle is None:
            self._idle.clear()
            context = self.drafter.new_context_cache(capacity)
            idle = context, DraftGraphs(self.drafter, context) if self.drafter.device.type == "cuda" else None
        else:
            self._idle.remove(idle)
        context, graphs = idle
        context.truncate(0)
        return DFlashProposer(self.drafter, context, graphs)

    def release(self, proposer: "DFlashProposer") -> None:
        self._idle.append((proposer.context, proposer.graphs))


class DraftGraphs:
    """Over one context cache: a draft per block size and a context pass per 1 … B newly committed positions;
    a prompt's context runs eagerly."""

    def __init__(self, drafter: DFlashDrafter, context: KVCache):
        pool = torch.cuda.graph_pool_handle()
        sizes = range(1, drafter.config.block_size + 1)
        ids = torch.zeros(1, dtype=torch.long, device=drafter.device)
        features = torch.zeros(1, len(drafter.config.target_layer_ids) * drafter.config.hidden_size,
                               dtype=drafter.dtype, device=drafter.device)
        self.drafts = {size: PassGraph(lambda block: drafter.draft(block, context), context, ids.expand(size), 0, pool)
                       for size in sizes if size > 1}
        self.contexts = {size: PassGraph(lambda rows: drafter.add_context(rows, context), context,
                                         features.expand(size, -1), size, pool) for size in sizes}


class DFlashProposer:
    """Committed features wait until the next draft needs them (plain steps then cost no drafter work),
    or until a prefill chunk's worth has gathered (one eager pass); fewer rows go through the context graphs, a
    block's worth a replay."""

    def __init__(self, drafter: DFlashDrafter, context: KVCache, graphs: DraftGraphs | None = None):
        self.drafter = drafter
        self.block_size = drafter.config.block_size
        self.target_layers = drafter.config.target_layer_ids
        self.context = context
        self.graphs = graphs
        self.pending: list[torch.Tensor] = []
        self.pending_rows = 0

    def commit(self, token_ids: list[int], features: torch.Tensor) -> None:
        self.pending.append(features)
        self.pending_rows += len(features)
        if self.pending_rows >= PREFILL_CHUNK:
            self._add_pending()

    def propose(self, anchor: int, count: int, sampler: Sampler) -> Proposal:
        """Greedy: the drafter's argmax; else drawn under the target's sampling parameters."""
        self._add_pending()
        block = torch.full((count + 1,), self.drafter.config.mask_token_id, device=self.drafter.device)
        block[0] = anchor
        graph = self.graphs.drafts.get(len(block)) if self.graphs else None
        logits = graph(block) if graph else self.drafter.draft(block, self.context)
        if sampler.params.greedy:
            return Proposal(logits.argmax(-1).tolist())
        probs = sampler.probabilities(logits)
        return Proposal(sampler.draw(probs), probs)

    def _add_pending(self) -> None:
        if not self.pending:
            return
        rows = torch.cat(self.pending)
        self.pending, self.pending_rows = [], 0
        if self.graphs is None or len(rows) >= PREFILL_CHUNK:  # a prompt's chunk: one eager pass
            self.drafter.add_context(rows, self.context)
            return
        # a plain streak's rows, a block's worth a graph replay, rather than one eager pass
        for chunk in rows.split(self.block_size):
            self.graphs.contexts[len(chunk)](chunk)
