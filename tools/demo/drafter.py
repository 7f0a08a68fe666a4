"""The demo's DFlash drafter: trained on the target's own continuations and hidden states, saved in the
z-lab layout (models.md) that app/engine/models/dflash.py reads.

Training (as the DFlash paper does it): pick anchor positions p in the answers; a block is the anchor
token t_p followed by mask tokens, at positions p … p + B - 1; its context is the target's features at
positions < p. The block attends to that context and to itself in both directions; position k of the
block (1 … B - 1) is trained towards the target's own distribution for t_{p + k} (its logits at
p + k - 1: the whole distribution teaches more per position than the one token, with which the drafter
overfit its data), with weight exp(-(k - 1) / gamma), because a draft only counts while every earlier one
was accepted. Block sizes cycle through 16, 8 and 4, with as many block tokens per sequence at each, so
that one drafter serves every block size the engine picks.
"""

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from app.engine.layers.rope import Rotary
from app.kernels.rotary_cache import rotate_halves
from tests.fixtures.tiny_dflash import tiny_dflash_config, write_dflash_folder
from tools.demo.drafter_data import DrafterData
from tools.demo.target import StepBudget, learning_rate
from tools.demo.target_outputs import TargetOutputs

FULL_SIZES = {"num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
              "intermediate_size": 768}
SMOKE_SIZES = {"num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
               "intermediate_size": 128}
BLOCK_SIZES = (16, 8, 4)  # cycled through, one per step; the largest is the config's block_size
GAMMA = {16: 7.0, 8: 4.0, 4: 2.5}  # loss decay per block size


@dataclass(frozen=True)
class DrafterTraining:
    steps: int
    batch: int  # sequences per step
    anchors: int  # blocks per sequence
    learning_rate: float
    warmup: int
    weight_decay: float = 0.01


FULL_TRAINING = DrafterTraining(steps=5047, batch=128, anchors=16, learning_rate=2e-3, warmup=50)
SMOKE_TRAINING = DrafterTraining(steps=30, batch=4, anchors=4, learning_rate=3e-3, warmup=5)


def drafter_config(target: dict, smoke: bool, mask_token_id: int, num_layers: int | None = None,
                   target_layer_ids: tuple[int, ...] | None = None) -> dict:
    """`target_layer_ids`: the target layers whose outputs the drafter reads (default: spread below the last)."""
    layers = target["num_hidden_layers"]
    target_layer_ids = target_layer_ids or ((0, layers // 2) if smoke else (1, layers // 2, layers - 2))
    sizes = SMOKE_SIZES if smoke else FULL_SIZES
    return tiny_dflash_config(target, block_size=max(BLOCK_SIZES), target_layer_ids=target_layer_ids,
                              mask_token_id=mask_token_id,
                              **{**sizes, "num_hidden_layers": num_layers or sizes["num_hidden_layers"]},
                              rope_theta=10000)


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

    def forward(self, x):
        return F.rms_norm(x.float(), self.weight.shape, self.weight.float(), self.eps).to(x.dtype)


class _Layer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        hidden, heads, dim = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
        kv_heads = c["num_key_value_heads"]
        eps, width = c["rms_norm_eps"], c["intermediate_size"]
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(hidden, heads * dim, bias=False)
        self.self_attn.k_proj = nn.Linear(hidden, kv_heads * dim, bias=False)
        self.self_attn.v_proj = nn.Linear(hidden, kv_heads * dim, bias=False)
        self.self_attn.o_proj = nn.Linear(heads * dim, hidden, bias=False)
        self.self_attn.q_norm, self.self_attn.k_norm = _RMSNorm(dim, eps), _RMSNorm(dim, eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(hidden, width, bias=False)
        self.mlp.up_proj = nn.Linear(hidden, width, bias=False)
        self.mlp.down_proj = nn.Linear(width, hidden, bias=False)
        self.input_layernorm, self.post_attention_layernorm = _RMSNorm(hidden, eps), _RMSNorm(hidden, eps)
        self.heads, self.kv_heads, self.dim = heads, kv_heads, dim


class DFlashTrainee(nn.Module):
    """The drafter's weights under their checkpoint names, with a batched forward over many blocks."""

    def __init__(self, config: dict):
        super().__init__()
        self.config = config  # the exported config.json
        hidden, width = config["hidden_size"], len(config["dflash_config"]["target_layer_ids"]) * config["hidden_size"]
        self.fc = nn.Linear(width, hidden, bias=False)
        self.hidden_norm = _RMSNorm(hidden, config["rms_norm_eps"])
        self.norm = _RMSNorm(hidden, config["rms_norm_eps"])
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config["num_hidden_layers"]))
        self.rotary_args = (config["head_dim"], config["rope_theta"], None)

    @classmethod
    def from_folder(cls, folder: Path) -> "DFlashTrainee":
        """An exported drafter (config.json, bf16 model.safetensors) back in this module, in float32."""
        trainee = cls(json.loads((folder / "config.json").read_text()))
        stored = load_file(str(folder / "model.safetensors"))
        trainee.load_state_dict({name: tensor.float() for name, tensor in stored.items()})
        return trainee

    def forward(self, blocks: torch.Tensor, features: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """blocks [S, N, B, H] (embedded anchor + mask tokens), features [S, L, K·H] of the target,
        anchors [S, N] (position of each block's first token) -> normed hidden states [S, N, B, H]."""
        sequences, count, size, hidden = blocks.shape
        length = features.shape[1]
        rotary = Rotary(*self.rotary_args, blocks.device)
        context = self.hidden_norm(self.fc(features))  # [S, L, H]
        context_cs = rotary.cos_sin(torch.arange(length, device=blocks.device).repeat(sequences), context.dtype)
        block_positions = (anchors[..., None] + torch.arange(size, device=blocks.device)).flatten()  # [S·N·B]
        block_cs = rotary.cos_sin(block_positions, context.dtype)
        # [S, N·B, L + N·B]: a block sees the context before its anchor and the whole of itself
        sees_context = torch.arange(length, device=blocks.device) < anchors[..., None, None]  # [S, N, 1, L]
        same_block = torch.eye(count, dtype=torch.bool, device=blocks.device)[:, None, :, None]  # [N, 1, N, 1]
        visible = torch.cat([sees_context.expand(-1, -1, size, -1),
                             same_block.expand(count, size, count, size).expand(sequences, -1, -1, -1, -1)
                             .flatten(-2)], dim=-1).flatten(1, 2)
        h = blocks.flatten(1, 2)  # [S, N·B, H]
        for layer in self.layers:
            x = layer.input_layernorm(h)
            q = self._rotated(layer, layer.self_attn.q_proj(x), layer.heads, block_cs)
            k = torch.cat([self._rotated(layer, layer.self_attn.k_proj(context), layer.kv_heads, context_cs),
                           self._rotated(layer, layer.self_attn.k_proj(x), layer.kv_heads, block_cs)], dim=1)
            v = torch.cat([layer.self_attn.v_proj(context), layer.self_attn.v_proj(x)], dim=1)
            v = v.unflatten(-1, (layer.kv_heads, layer.dim))
            groups = layer.heads // layer.kv_heads  # query head h reads key/value head h // groups
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.repeat_interleave(groups, 2).transpose(1, 2),
                v.repeat_interleave(groups, 2).transpose(1, 2), attn_mask=visible[:, None])
            h = h + layer.self_attn.o_proj(out.transpose(1, 2).flatten(-2))
            y = layer.post_attention_layernorm(h)
            h = h + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(y)) * layer.mlp.up_proj(y))
        return self.norm(h).view(sequences, count, size, hidden)

    def _rotated(self, layer, x, heads, cos_sin):
        """x [S, T, heads·d], cos/sin [S·T, d/2] -> q/k-normed, rotated [S, T, heads, d]."""
        norm = layer.self_attn.q_norm if heads == layer.heads else layer.self_attn.k_norm
        x = norm(x.unflatten(-1, (heads, layer.dim)))
        return rotate_halves(x.flatten(0, 1), *cos_sin).view_as(x)


def train_drafter(trainee: DFlashTrainee, config: dict, target, data: DrafterData, settings: DrafterTraining,
                  device: torch.device, seed: int, log, seconds: float | None = None) -> dict:
    """`target` is the trained transformers model (frozen): its embedding, LM head and features."""
    started = time.monotonic()
    outputs = TargetOutputs.compute(target, data, config["dflash_config"]["target_layer_ids"], device)
    outputs_seconds = round(time.monotonic() - started, 1)
    log(f"target outputs along {len(data.lengths)} rows: {outputs.features.shape[0]} tokens, {outputs_seconds} s")
    training = DrafterSteps(trainee, config, target, outputs, data, settings, device, seed)
    losses, steps, step, budget = [], settings.steps, 0, StepBudget(seconds and seconds - outputs_seconds)
    while step < steps:
        size, loss = training.step(step, steps)
        losses.append(loss)
        step += 1
        steps = budget.fit(step, steps)
        if step % 50 == 0 or step == steps:
            log(f"drafter step {step}/{steps} (block {size}): weighted loss {losses[-1].item():.3f}, "
                f"{time.monotonic() - started:.0f} s")
    trainee.eval()
    return {"steps": steps, "final_weighted_loss": torch.stack(losses[-30:]).mean().item(),
            "seconds": round(time.monotonic() - started, 1), "target_outputs_seconds": outputs_seconds,
            "sequences": len(data.lengths)}


class DrafterSteps:
    """The drafter's optimizer steps, one at a time: anchor blocks drawn from `data`, the loss against the
    target's stored distributions, AdamW. Nothing in a step waits for the device, so steps queue up on it."""

    def __init__(self, trainee: DFlashTrainee, config: dict, target, outputs: TargetOutputs, data: DrafterData,
                 settings: DrafterTraining, device: torch.device, seed: int):
        self.trainee, self.target, self.outputs, self.data = trainee.to(device).train(), target, outputs, data
        self.settings, self.device = settings, device
        self.optimizer = torch.optim.AdamW(trainee.parameters(), lr=settings.learning_rate, betas=(0.9, 0.95),
                                           weight_decay=settings.weight_decay)
        self.generator = torch.Generator().manual_seed(seed)
        self.mask_id = config["dflash_config"]["mask_token_id"]

    def step(self, step: int, steps: int) -> tuple[int, torch.Tensor]:
        """Step `step` of `steps` (for the learning rate schedule) -> its block size and loss (on the device)."""
        device, settings, outputs = self.device, self.settings, self.outputs
        size = BLOCK_SIZES[step % len(BLOCK_SIZES)]
        # as many block tokens per sequence at every block size
        rows, anchors, anchor_ids, valid = self.data.batch(settings.batch,
                                                           settings.anchors * max(BLOCK_SIZES) // size, size,
                                                           self.generator)
        width = int(anchors.max())  # read on the host: nothing in a step waits for the GPU
        rows, anchors, anchor_ids, valid = rows.to(device), anchors.to(device), anchor_ids.to(device), valid.to(device)
        predicted = (anchors[..., None] + torch.arange(1, size, device=device)).flatten(1)  # [S, N·(B-1)]
        # the target's distribution for token j comes from its logits at j - 1: [S·N·(B-1), V]
        teacher = outputs.teacher_logits(self.target, rows, predicted - 1).softmax(-1).flatten(0, 1)
        block_ids = torch.full((*anchors.shape, size), self.mask_id, device=device)
        block_ids[..., 0] = anchor_ids
        features = outputs.context(rows, width)
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            out = self.trainee(self.target.get_input_embeddings().weight[block_ids], features, anchors)[:, :, 1:]
            logits = (out @ self.target.lm_head.weight.T.to(out.dtype)).float()
        per_token = -(teacher * logits.flatten(0, -2).log_softmax(-1)).sum(-1)
        weights = torch.exp(-torch.arange(size - 1, device=device) / GAMMA[size]) * valid[..., 1:size]
        loss = (per_token.view_as(weights) * weights).sum() / weights.sum()
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, settings.learning_rate, settings.warmup)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.trainee.parameters(), 1.0)
        self.optimizer.step()
        return size, loss.detach()


def export_drafter(trainee: DFlashTrainee, config: dict, folder: Path) -> Path:
    tensors = {name: tensor.detach().cpu().to(torch.bfloat16).contiguous()
               for name, tensor in trainee.state_dict().items()}
    return write_dflash_folder(folder, config, tensors)
