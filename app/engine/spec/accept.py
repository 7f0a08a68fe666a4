"""Which drafts a verify keeps, and the token after them, so emitted tokens follow exactly the target's
distribution (sampling parameters included).

- One-hot proposals: draw the target's y_i at every position, keep drafts while d_i == y_i, emit y at the first
  mismatch: Leviathan / Chen's rule for q = one-hot(d) (greedy: p = one-hot(argmax)).
- Sampled d_i ~ q_i: keep with probability min(1, p_i(d_i) / q_i(d_i)); on rejection emit from
  norm(max(p_i - q_i, 0)); if all are kept, the bonus token comes from p at the last position.
"""

import torch

from app.engine.generation.sampling import Sampler


def accept_one_hot(drafts: list[int], target_logits: torch.Tensor, sampler: Sampler) -> tuple[int, int]:
    """drafts [B - 1], target_logits [B, V] -> (drafts kept, the token that follows them)."""
    targets = sampler.sample_each(target_logits)
    for position, (draft, target) in enumerate(zip(drafts, targets, strict=False)):
        if draft != target:
            return position, target
    return len(drafts), targets[-1]


def accept_sampled(
    drafts: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor, sampler: Sampler
) -> tuple[int, int]:
    """drafts [B - 1] drawn from draft_probs [B - 1, V]; target_probs [B, V] -> (drafts kept, next token)."""
    positions = torch.arange(len(drafts), device=target_probs.device)
    tokens = torch.tensor(drafts, device=target_probs.device)
    p, q = target_probs[positions, tokens], draft_probs[positions, tokens]
    uniform = torch.rand(len(drafts), generator=sampler.generator, device=target_probs.device)
    kept = int((uniform * q < p).cumprod(0).sum())  # u < p / q, without dividing; q(d) > 0 as d was drawn from q
    if kept == len(drafts):
        return kept, sampler.draw(target_probs[-1:])[0]
    residual = (target_probs[kept] - draft_probs[kept]).clamp_min(0)
    # p <= q everywhere means p == q, which never rejects; rounding can, so fall back to p itself
    residual = residual if residual.sum() > 0 else target_probs[kept]
    return kept, sampler.draw((residual / residual.sum())[None])[0]
