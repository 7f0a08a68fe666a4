"""Turning logits into the next token: greedy, or temperature / top-k / top-p sampling, seeded."""

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no limit
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


class Sampler:
    """Draws tokens with its own random generator, so a seed reproduces a whole answer."""

    def __init__(self, params: SamplingParams, device: torch.device):
        self.params = params
        self.generator = torch.Generator(device=device)
        if params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(params.seed)

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [..., V] -> the distribution actually sampled from [..., V] (float32)."""
        p = self.params
        logits = logits.float()
        if p.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        logits = logits / p.temperature
        if 0 < p.top_k < logits.shape[-1]:
            kth = torch.topk(logits, p.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            # keep the smallest prefix whose mass reaches top_p (the token that crosses it included)
            outside = sorted_probs.cumsum(-1) - sorted_probs >= p.top_p
            sorted_probs = sorted_probs.masked_fill(outside, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def sample(self, logits: torch.Tensor) -> int:
        """logits [V] -> one token id."""
        return self.sample_each(logits[None])[0]

    def sample_each(self, logits: torch.Tensor) -> list[int]:
        """logits [T, V] -> one token id per row, drawn independently (one host synchronisation)."""
        return self.sample_on_device(logits).tolist()

    def sample_on_device(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [T, V] -> one token id per row [T] where the logits are, with no host synchronisation."""
        if self.params.greedy:
            return logits.argmax(-1)
        return self.draw_on_device(self.probabilities(logits))

    def draw(self, probs: torch.Tensor) -> list[int]:
        """probs [T, V] -> one token id per row, from this sampler's generator."""
        return self.draw_on_device(probs).tolist()

    def draw_on_device(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(probs, 1, generator=self.generator).flatten()
