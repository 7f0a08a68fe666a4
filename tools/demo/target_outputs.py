"""The frozen target's outputs along the drafter's training rows, computed once before the drafter trains:
its features at the drafter's target layers and its normed last hidden state (times the LM head, the
teacher's logits). Each row is drawn tens of times during training, and running the target again at every
step was most of a step's time. Kept flat (no padding) on the training device, in the precision the
target runs in there (bfloat16 on a GPU)."""

import torch

from tools.demo.drafter_data import DrafterData


class TargetOutputs:
    def __init__(self, features: torch.Tensor, last: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor):
        self.features, self.last = features, last  # [T, K·H], [T, H] over all rows' tokens
        self.offsets, self.lengths = offsets, lengths  # [N]: where each row starts in them, and its length

    @classmethod
    @torch.no_grad()
    def compute(cls, target, data: DrafterData, layer_ids: list[int], device: torch.device,
                rows_per_pass: int = 64) -> "TargetOutputs":
        hidden = target.config.hidden_size
        total = int(data.lengths.sum())
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        features = torch.empty(total, len(layer_ids) * hidden, dtype=dtype, device=device)
        last = torch.empty(total, hidden, dtype=dtype, device=device)
        offsets = torch.empty_like(data.lengths)
        at = 0
        for chosen in data.lengths.argsort(descending=True).split(rows_per_pass):  # similar lengths together
            lengths = data.lengths[chosen]
            ids = data.rows[chosen, : int(lengths.max())].to(device)
            real = (torch.arange(ids.shape[1]) < lengths[:, None]).to(device)  # right padding is never read
            with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
                out = target.model(input_ids=ids, output_hidden_states=True)
            count = int(lengths.sum())
            features[at: at + count] = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)[real]
            last[at: at + count] = out.last_hidden_state[real]
            offsets[chosen] = at + lengths.cumsum(0) - lengths
            at += count
        return cls(features, last, offsets.to(device), data.lengths.to(device))

    def context(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """rows [S] -> features [S, width, K·H] of positions 0 … width - 1 (past a row's end: its last)."""
        return self.features[self._index(rows, torch.arange(width, device=rows.device).expand(len(rows), -1))]

    def teacher_logits(self, target, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """rows [S], positions [S, P] -> the target's logits there [S, P, V] (float32)."""
        last = self.last[self._index(rows, positions)]
        return (last @ target.lm_head.weight.T.to(last.dtype)).float()

    def _index(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.offsets[rows, None] + torch.minimum(positions, self.lengths[rows, None] - 1)
