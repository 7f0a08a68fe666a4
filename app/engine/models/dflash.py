"""DFlash drafter (z-lab layout): a few Qwen3-style layers that draft a whole block in one pass, using the
target's `embed` and `lm_head`. Its context c = hidden_norm(fc(feature)) [N, H], feature being the outputs of
`target_layer_ids` concatenated. Queries come from the block only; keys and values from context and block with the
same weights; q/k RMSNorm per head, RoPE on all; no causal mask inside the block. Context K/V are cached once per
committed position; the block's are written past the committed rows and never kept.
"""

from dataclasses import dataclass
from pathlib import Path

import torch

from app.engine.layers.kv_cache import KVCache
from app.engine.layers.ops import attend, silu_glu
from app.engine.layers.rope import Rotary
from app.engine.weights.checkpoint import Checkpoint
from app.errors import UserError
from app.kernels.choice import triton_runs
from app.kernels.decode_attention import decode_attention, takes_head_dim, takes_queries
from app.kernels.rotary_cache import rotary_cache_write, rotary_cache_write_torch
from app.model_folder import ModelFolder
from app.plan import dtype_bytes


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]

    @classmethod
    def from_dict(cls, config: dict) -> "DFlashConfig":
        dflash = config["dflash_config"]
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        return cls(
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=config["num_attention_heads"],
            num_key_value_heads=config["num_key_value_heads"],
            head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
            vocab_size=config["vocab_size"],
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=config.get("rope_theta", rope.get("rope_theta", 10000.0)),
            rope_scaling=rope or None,
            block_size=dflash.get("block_size") or config["block_size"],
            mask_token_id=dflash["mask_token_id"],
            target_layer_ids=tuple(dflash["target_layer_ids"]),
        )

    def device_bytes(self, folder: ModelFolder, context: int, dtype: str) -> int:
        """Weights in the compute dtype plus the context KV cache for `context` positions."""
        per_value = dtype_bytes(dtype)
        weights = sum(info.numel for info in folder.tensors.values()) * per_value
        cache = self.num_hidden_layers * context * 2 * self.num_key_value_heads * self.head_dim * per_value
        return weights + cache


def open_dflash(path: str | Path) -> tuple[ModelFolder, DFlashConfig]:
    folder = ModelFolder.open(path, any_model_type=True)
    config = folder.config
    if "dflash_config" not in config:
        kind = ", ".join(config.get("architectures") or [str(config.get("model_type"))])
        raise UserError(f"'{folder.path}' is not a DFlash drafter: its config.json ({kind}) has no dflash_config")
    if config.get("attention_bias") or config.get("use_sliding_window"):
        raise UserError(f"the drafter in '{folder.path}' uses attention biases or sliding windows, "
                        "which this app's DFlash drafter does not support")
    try:
        drafter = DFlashConfig.from_dict(config)
    except KeyError as missing:
        raise UserError(f"the drafter's config.json in '{folder.path}' lacks the key {missing}") from None
    if drafter.block_size < 2:
        raise UserError(f"the drafter's block size {drafter.block_size} leaves no room for drafts")
    return folder, drafter


def check_pairing(drafter: DFlashConfig, target_config) -> None:
    target = target_config
    if drafter.hidden_size != target.hidden_size:
        raise UserError(f"the drafter's hidden size {drafter.hidden_size} is not the target's {target.hidden_size}: "
                        "it was trained for another model")
    if drafter.vocab_size != target.vocab_size:
        raise UserError(f"the drafter's vocabulary ({drafter.vocab_size} tokens) is not the target's "
                        f"({target.vocab_size}): it was trained for another model")
    if not 0 <= drafter.mask_token_id < target.vocab_size:
        raise UserError(f"the drafter's mask token id {drafter.mask_token_id} is outside the target's vocabulary "
                        f"(0 … {target.vocab_size - 1})")
    outside = [i for i in drafter.target_layer_ids if not 0 <= i < target.num_hidden_layers]
    if outside or not drafter.target_layer_ids:
        raise UserError(f"the drafter reads target layers {list(drafter.target_layer_ids)} but the target has "
                        f"layers 0 … {target.num_hidden_layers - 1}")


class DFlashDrafter:
    """The drafter's weights on the target's device."""

    def __init__(self, config: DFlashConfig, checkpoint: Checkpoint, target):
        c = self.config = config
        self.target = target
        self.device, self.dtype = target.device, target.dtype
        hidden, heads, kv_heads, head_dim = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        prefix = "model." if checkpoint.has("model.norm.weight") else ""

        load = checkpoint.loader(self.device, self.dtype, prefix)

        width = len(c.target_layer_ids) * hidden
        fc_shape = checkpoint.info(prefix + "fc.weight").shape
        if fc_shape != (hidden, width):
            raise UserError(f"the drafter's fc.weight is {list(fc_shape)} but {len(c.target_layer_ids)} target layers "
                            f"of hidden size {hidden} need [{hidden}, {width}]: the weights do not match config.json")
        self.fc = load("fc.weight", (hidden, width))
        self.hidden_norm = load("hidden_norm.weight", (hidden,), keep_float32=True)
        self.norm = load("norm.weight", (hidden,), keep_float32=True)
        self.layers = []
        for i in range(c.num_hidden_layers):
            p = f"layers.{i}."
            # queries, keys and values in one product, as the rotary kernel takes them; context rows take the
            # keys' and values' rows of it
            qkv = torch.cat([load(p + f"self_attn.{name}_proj.weight", (rows * head_dim, hidden))
                             for name, rows in (("q", heads), ("k", kv_heads), ("v", kv_heads))])
            self.layers.append({
                "input_norm": load(p + "input_layernorm.weight", (hidden,), keep_float32=True),
                "post_norm": load(p + "post_attention_layernorm.weight", (hidden,), keep_float32=True),
                "qkv": qkv,
                "kv": qkv[heads * head_dim:],
                "o": load(p + "self_attn.o_proj.weight", (hidden, heads * head_dim)),
                "head_norms": torch.stack([load(p + f"self_attn.{name}_norm.weight", (head_dim,), keep_float32=True)
                                           for name in ("q", "k")]),
                "gate": load(p + "mlp.gate_proj.weight", (c.intermediate_size, hidden)),
                "up": load(p + "mlp.up_proj.weight", (c.intermediate_size, hidden)),
                "down": load(p + "mlp.down_proj.weight", (hidden, c.intermediate_size)),
            })
        self.rotary = Rotary(head_dim, c.rope_theta, c.rope_scaling, self.device)
        self.in_kernels = triton_runs(self.device) and takes_head_dim(head_dim)  # else the torch references
        self.rotary_write = rotary_cache_write if self.in_kernels else rotary_cache_write_torch

    def new_context_cache(self, capacity: int) -> KVCache:
        c = self.config
        shape = (c.num_key_value_heads, c.head_dim)
        return KVCache(c.num_hidden_layers, capacity, {"k": shape, "v": shape}, self.dtype, self.device)

    def add_context(self, features: torch.Tensor, cache: KVCache) -> None:
        """features [N, K·H]: the target layers' outputs at the next positions."""
        c = self.config
        context = self._norm(features.to(self.dtype) @ self.fc.T, self.hidden_norm)
        positions = cache.positions(len(context))
        cos, sin = self.rotary.cos_sin(positions, self.dtype)
        for index, layer in enumerate(self.layers):
            kv = (context @ layer["kv"].T).unflatten(-1, (2 * c.num_key_value_heads, c.head_dim))
            self._write_keys_values(index, layer, kv, cos, sin, positions, cache)
        cache.advance(len(context))

    def draft(self, block_ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """block_ids [B] (anchor, then mask tokens) -> float32 logits [B - 1, V] for positions 1 … B - 1; the
        cache is left as it was."""
        c = self.config
        tokens, heads, kv_heads = len(block_ids), c.num_attention_heads, c.num_key_value_heads
        positions = cache.positions(tokens)
        cos, sin = self.rotary.cos_sin(positions, self.dtype)
        # every query sees the whole context and the whole block (bidirectional); rows past the block are stale
        # (graphs): the kernel masks each query past the position given for it, here the block's last
        in_kernel = self.in_kernels and takes_queries(tokens, heads, kv_heads)
        rows = cache.num_rows(tokens)
        seen_up_to = positions[-1:].repeat(tokens)
        visible = None if in_kernel else (torch.arange(rows, device=self.device) <= positions[-1]).expand(tokens, -1)
        h, mlp_output = self.target.embed[block_ids], None
        for index, layer in enumerate(self.layers):
            h, x = self._add_norm(h, mlp_output, layer["input_norm"])  # the layer before's MLP added here
            qkv = (x @ layer["qkv"].T).unflatten(-1, (heads + 2 * kv_heads, c.head_dim))
            q, keys, values = self._write_keys_values(index, layer, qkv, cos, sin, positions, cache)
            if in_kernel:
                out = decode_attention(q, keys, values, seen_up_to, c.head_dim**-0.5, None, None)
            else:
                out = attend(q, keys[:rows], values[:rows], visible, c.head_dim**-0.5)
            h, x = self._add_norm(h, out.flatten(-2) @ layer["o"].T, layer["post_norm"])
            mlp_output = silu_glu(x, layer["gate"], layer["up"], layer["down"])
        h = self._add_norm(h, mlp_output, self.norm)[1][1:]
        return (h @ self.target.lm_head.T).float()

    def _write_keys_values(self, index: int, layer: dict, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           positions: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """qkv [T, queries + 2 kv_heads, head_dim] (no queries: a context's rows) -> the queries normed and rotated;
        the keys normed and rotated, and the values, written to the layer's rows `positions` of the cache, whose
        buffers [capacity, kv_heads, head_dim] come back beside them."""
        keys, values = cache.layer_rows(index, "k"), cache.layer_rows(index, "v")
        q = self.rotary_write(qkv, cos, sin, positions, keys, values, None, layer["head_norms"],
                              self.config.rms_norm_eps)
        return q, keys, values

    def _add_norm(self, h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """h [T, H] plus delta (None: nothing) and its RMSNorm, in the target's norm kernel (norms.add_rms_norm_op):
        one launch where torch's add and norm make four."""
        return self.target.add_norm(h, delta, weight, self.config.rms_norm_eps)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.target.norm_alone(x, weight, self.config.rms_norm_eps)
