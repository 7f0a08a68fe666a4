"""The drafter's training rows: the target's own continuations of prompts, right-padded token rows with
where each answer starts and ends, and random anchor blocks drawn from their answers."""

import torch
import torch.nn.functional as F


class DrafterData:
    """The target's continuations: token rows [N, L] (right-padded), where each answer starts and ends."""

    def __init__(self, rows: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor):
        self.rows, self.starts, self.lengths = rows, starts, lengths

    @classmethod
    def from_pairs(cls, pairs: list[tuple[list[int], list[int]]], pad_id: int) -> "DrafterData":
        """(prompt ids, answer ids) pairs as right-padded rows."""
        lengths = [len(prompt) + len(answer) for prompt, answer in pairs]
        rows = torch.full((len(pairs), max(lengths)), pad_id)
        for row, (prompt, answer) in enumerate(pairs):
            rows[row, : lengths[row]] = torch.tensor(prompt + answer)
        return cls(rows, torch.tensor([len(prompt) for prompt, _ in pairs]), torch.tensor(lengths))

    @classmethod
    def joined(cls, parts: list["DrafterData"]) -> "DrafterData":
        width = max(part.rows.shape[1] for part in parts)
        rows = [F.pad(part.rows, (0, width - part.rows.shape[1])) for part in parts]  # past the ends: never read
        return cls(torch.cat(rows), torch.cat([p.starts for p in parts]), torch.cat([p.lengths for p in parts]))

    def batch(self, sequences: int, anchors: int, size: int, generator: torch.Generator):
        """rows [S] drawn at random, anchors [S, N] in their answers, the anchor tokens [S, N], and
        valid [S, N, size]: which block positions hold real tokens."""
        chosen = torch.randint(len(self.rows), (sequences,), generator=generator)
        starts, lengths = self.starts[chosen], self.lengths[chosen]
        span = (lengths - 1 - starts).clamp(min=1)
        anchors = starts[:, None] + (torch.rand(sequences, anchors, generator=generator) * span[:, None]).long()
        valid = (anchors[..., None] + torch.arange(size)) < lengths[:, None, None]
        return chosen, anchors, self.rows[chosen].gather(1, anchors), valid
