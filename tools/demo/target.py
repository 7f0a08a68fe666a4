"""The demo target: a small GPT-OSS (sinks, alternating sliding windows, YaRN, top-k of many experts)
trained through transformers' GptOssForCausalLM, its experts fine-tuned with MXFP4 rounding in the
loop (straight-through) for the last part of training, and exported in the published layout.
"""

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.utils import parametrize
from transformers import GptOssConfig, GptOssForCausalLM, Mxfp4Config

from app.kernels.formats.mxfp4 import decode_mxfp4, encode_mxfp4
from app.model_folder import ModelFolder
from tests.fixtures.tiny_gpt_oss import tiny_gpt_oss_config, write_gpt_oss_folder

# Sizes on top of gpt-oss-20b's config.json (the other keys, YaRN included, stay). The sliding window is 8
# tokens (the tiny test models' value, which the shipped model was trained with), not the 20b's 128. The
# residual stream is wider than the 4 × 64 query features, as the 20b's is.
FULL_SIZES = {
    "hidden_size": 384, "intermediate_size": 256, "head_dim": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 6, "num_local_experts": 16, "num_experts_per_tok": 4,
    "experts_per_token": 4, "vocab_size": 4096, "sliding_window": 8,
}
SMOKE_SIZES = {
    "hidden_size": 64, "intermediate_size": 64, "head_dim": 16, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 4, "num_local_experts": 8, "num_experts_per_tok": 2,
    "experts_per_token": 2, "sliding_window": 16, "vocab_size": 512,
}
EXPERT_MATRICES = ("gate_up_proj", "down_proj")
# The demo's sampling defaults (generation_config.json, read by the app for a new chat): at temperature 1.0
# its answers fall apart into word salad; at 0.3 they keep to sentences in its docstrings' style.
SAMPLING = {"temperature": 0.3, "top_p": 0.9, "max_new_tokens": 256}


@dataclass(frozen=True)
class TargetTraining:
    steps: int
    batch: int  # rows of `sequence` tokens per step
    sequence: int
    learning_rate: float
    warmup: int
    weight_decay: float = 0.1
    quantized_fraction: float = 0.25  # the last part of the steps sees MXFP4-rounded experts
    router_aux_loss_coef: float = 0.02


# 3.6 epochs of the training chats: a target trained longer memorises its answers, and its drafter then
# follows it less well on new prompts (bench/NOTES.md, "Demo drafter").
FULL_TRAINING = TargetTraining(steps=340, batch=32, sequence=512, learning_rate=2e-3, warmup=50)
SMOKE_TRAINING = TargetTraining(steps=30, batch=4, sequence=128, learning_rate=3e-3, warmup=5)


def target_config(smoke: bool, vocab_size: int, hidden_size: int | None = None) -> dict:
    """`hidden_size` widens the residual stream only: the heads keep their sizes (as gpt-oss-20b's 64 × 64
    query features are not its 2880)."""
    sizes = SMOKE_SIZES if smoke else FULL_SIZES
    return tiny_gpt_oss_config(**{**sizes, "vocab_size": vocab_size,
                                  "hidden_size": hidden_size or sizes["hidden_size"]})


def build_target(config: dict, settings: TargetTraining, seed: int) -> GptOssForCausalLM:
    torch.manual_seed(seed)
    training_config = {k: v for k, v in config.items() if k != "quantization_config"}
    training_config.update(router_aux_loss_coef=settings.router_aux_loss_coef, output_router_logits=True)
    return GptOssForCausalLM(GptOssConfig(**training_config))


def load_target(folder: Path, device: torch.device) -> GptOssForCausalLM:
    """A GPT-OSS folder in transformers, in float32: an exported target for generation and features, and the
    oracle of the tests. MXFP4 experts are decoded exactly on load; left quantized, recent transformers would
    fetch its kernels from the hub, which needs a network and a GPU."""
    mxfp4 = ModelFolder.open(folder).quantization.method == "mxfp4"
    model = GptOssForCausalLM.from_pretrained(str(folder), dtype=torch.float32,
                                              quantization_config=Mxfp4Config(dequantize=True) if mxfp4 else None)
    return model.float().to(device).eval()


class _Mxfp4RoundTrip(torch.nn.Module):
    """Experts as the checkpoint will hold them (straight-through gradient). transformers keeps
    gate_up_proj [E, H, 2W] and down_proj [E, W, H] (inputs first); MXFP4 groups run along the inputs."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + (mxfp4_round_trip(weight) - weight).detach()


def mxfp4_round_trip(weight: torch.Tensor) -> torch.Tensor:
    """[E, in, out] -> the same values after MXFP4 encoding and decoding."""
    blocks, scales = encode_mxfp4(weight.detach().transpose(1, 2))
    return decode_mxfp4(blocks, scales, torch.float32).transpose(1, 2).to(weight.dtype)


def train_target(model: GptOssForCausalLM, rows: torch.Tensor, settings: TargetTraining, device: torch.device,
                 seed: int, log, seconds: float | None = None) -> dict:
    """rows [N, sequence] of packed chats. With `seconds`, the step count is fitted to the time
    (StepBudget); the report says how many ran. Returns what the model card reports about the run."""
    model.to(device).train()
    if device.type == "cpu":
        model.set_experts_implementation("eager")  # grouped_mm's first CPU call takes seconds
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                                   {"params": other, "weight_decay": 0.0}],
                                  lr=settings.learning_rate, betas=(0.9, 0.95), fused=device.type == "cuda")
    generator = torch.Generator().manual_seed(seed)
    order, cursor = torch.randperm(len(rows), generator=generator), 0
    steps = settings.steps
    quantized_from = None
    started, losses, step, budget = time.monotonic(), [], 0, StepBudget(seconds)
    while step < steps:
        steps = budget.fit(step, steps)
        if quantized_from is None and step >= int(steps * (1 - settings.quantized_fraction)):
            _start_quantized_experts(model)
            quantized_from = step
        if cursor + settings.batch > len(order):
            order, cursor = torch.randperm(len(rows), generator=generator), 0
        batch = rows[order[cursor: cursor + settings.batch]].to(device)
        cursor += settings.batch
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, settings.learning_rate, settings.warmup)
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"), parametrize.cached():
            output = model(input_ids=batch, labels=batch)
        optimizer.zero_grad(set_to_none=True)
        output.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(output.loss.item() - settings.router_aux_loss_coef * output.aux_loss.item())
        step += 1
        if step % 50 == 0 or step == steps:
            log(f"target step {step}/{steps}: loss {losses[-1]:.3f}, {time.monotonic() - started:.0f} s")
    _fix_exported_precision(model)
    return {"steps": steps, "tokens_seen": steps * settings.batch * settings.sequence,
            "epochs": round(steps * settings.batch / len(rows), 2),
            "final_train_loss": sum(losses[-20:]) / len(losses[-20:]),
            "seconds": round(time.monotonic() - started, 1), "quantized_from_step": quantized_from}


class StepBudget:
    """Fits a phase's step count (at most the one asked for) to end within `seconds` of its start. The time
    per step is measured from step 20 on (the first ones pay for warm-up and for each new shape), and the
    count is fitted again every 50 steps at the latest speed: a GPU's early steps often run slower."""

    FIRST, EVERY = 20, 50

    def __init__(self, seconds: float | None):
        self.seconds, self.started, self.asked = seconds, time.monotonic(), None
        self.mark, self.mark_step = 0.0, 0

    def fit(self, step: int, steps: int) -> int:
        self.asked = self.asked or steps
        if self.seconds is None or step < self.FIRST or (step - self.FIRST) % self.EVERY:
            return steps
        now = time.monotonic()
        mark, mark_step, self.mark, self.mark_step = self.mark, self.mark_step, now, step
        if step == self.FIRST:
            return steps
        per_step = (now - mark) / (step - mark_step)
        return min(self.asked, step + max(5, int((self.seconds - (now - self.started)) / per_step)))


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine down to a tenth (the drafter's schedule too)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))

def _start_quantized_experts(model: GptOssForCausalLM) -> None:
    for layer in model.model.layers:
        for name in EXPERT_MATRICES:
            parametrize.register_parametrization(layer.mlp.experts, name, _Mxfp4RoundTrip())


def _fix_exported_precision(model: GptOssForCausalLM) -> None:
    """Make the float32 model hold exactly what the checkpoint will: MXFP4 experts, bf16 everything else."""
    for layer in model.model.layers:
        for name in EXPERT_MATRICES:
            if parametrize.is_parametrized(layer.mlp.experts, name):
                parametrize.remove_parametrizations(layer.mlp.experts, name, leave_parametrized=False)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.rsplit(".", 1)[-1] in EXPERT_MATRICES:
                parameter.copy_(mxfp4_round_trip(parameter.float()))
            else:
                parameter.copy_(parameter.to(torch.bfloat16).float())
    model.config.output_router_logits = False  # the balancing loss was for training (and breaks generate)
    model.eval()


def export_target(model: GptOssForCausalLM, config: dict, folder: Path) -> Path:
    """The published gpt-oss layout: dense tensors bf16, experts MXFP4 blocks/scales with bf16 biases."""
    dense, experts = {}, {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu()
        leaf = name.rsplit(".", 1)[-1]
        if leaf in EXPERT_MATRICES:
            blocks, scales = encode_mxfp4(tensor.float().transpose(1, 2))  # rows are output features
            experts[f"{name}_blocks"], experts[f"{name}_scales"] = blocks.contiguous(), scales.contiguous()
        elif ".mlp.experts." in name:
            experts[name] = tensor.to(torch.bfloat16).contiguous()
        else:
            dense[name] = tensor.to(torch.bfloat16).contiguous()
    folder = write_gpt_oss_folder(folder, config, dense, experts)
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, **SAMPLING}, indent=2))
    return folder
