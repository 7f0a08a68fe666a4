"""One speculative step: draft → route-ahead prefetch → verify (one target pass) → accept → rewind."""

import torch

from app.engine.cuda_graph import DecodeGraph, graph_ready
from app.engine.generate import prefill
from app.engine.kv_cache import KVCache
from app.engine.sampling import Sampler
from app.engine.segmented_decode import SegmentedDecode, segments_ready
from app.engine.spec.accept import accept_one_hot, accept_sampled
from app.engine.spec.drafter import Drafter, Proposal
from app.engine.spec.routing import prefetch_for_block


class Speculator:
    """A target model, its KV cache and a drafter, kept in step: after every step the target cache and
    the drafter's context hold exactly the committed tokens (the prompt and every emitted token but
    the last, which is the next step's anchor)."""

    def __init__(self, model, cache: KVCache, drafter: Drafter, sampler: Sampler):
        self.model = model
        self.cache = cache
        self.drafter = drafter
        self.sampler = sampler
        self.capture = drafter.target_layers
        self.graphs = {}
        if graph_ready(model):
            self.graphs = block_graphs(model, cache, self.capture, drafter.block_size)
        elif segments_ready(model):  # experts offloaded: plain steps are segmented, verify blocks stay eager
            self.graphs = {1: SegmentedDecode(model, cache, self.capture)}

    def prefill(self, prompt_ids: list[int]) -> torch.Tensor:
        """The prompt's last logits [V]; the drafter receives the features of every prompt position."""
        return prefill(self.model, self.cache, prompt_ids, self.capture, self.drafter.commit)

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
        """logits [B, V] and captured features [B, F], replayed from the block size's CUDA graph when there
        is one. The features are copied out: the drafter keeps them past the next replay."""
        graph = self.graphs.get(len(block))
        if graph:
            return graph.run(block), graph.features.clone()
        return self.model.forward(torch.tensor(block, device=self.model.device), self.cache, capture=self.capture)


def block_graphs(model, cache: KVCache, capture: tuple[int, ...], max_block: int) -> dict[int, DecodeGraph]:
    """One CUDA graph per block size 1 … max_block, captured before the prefill (as plain decoding does)
    so that no step pays for a capture; they share one memory pool, since one replays at a time."""
    pool = torch.cuda.graph_pool_handle()
    return {size: DecodeGraph(model, cache, capture, size, pool) for size in range(1, max_block + 1)}
