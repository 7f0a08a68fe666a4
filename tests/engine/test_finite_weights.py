"""Weights holding NaN or infinity are refused when the model loads, naming the tensor (they would load
silently, and greedy decoding would emit token 0 for ever)."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from app.cli import main
from app.engine.session import Session
from app.engine.weights import checkpoint
from app.errors import UserError

DENSE_SHARD = "model-00000-of-00002.safetensors"
EXPERT_SHARD = "model-00001-of-00002.safetensors"


def poisoned(source, folder, shard: str, name: str, flat_index: int, value: float):
    """A copy of the model folder with one element of one tensor replaced by `value`."""
    shutil.copytree(source, folder)
    tensors = load_file(folder / shard)
    tensor = tensors[name].clone()
    tensor.view(-1)[flat_index] = value
    save_file({**tensors, name: tensor}, str(folder / shard), metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize(("shard", "name", "flat_index", "value"), [
    (DENSE_SHARD, "model.layers.2.input_layernorm.weight", 17, float("nan")),
    (DENSE_SHARD, "model.layers.0.mlp.router.weight", 100, float("inf")),
    (DENSE_SHARD, "model.norm.weight", 0, float("-inf")),
    (DENSE_SHARD, "model.embed_tokens.weight", 384 * 64 - 1, float("nan")),
    (EXPERT_SHARD, "model.layers.3.mlp.experts.down_proj_bias", 5, float("nan")),
])
def test_a_weight_that_is_not_finite_is_refused_at_load_with_its_name(tiny_gpt_oss, tmp_path, shard, name,
                                                                      flat_index, value):
    folder = poisoned(tiny_gpt_oss, tmp_path / "model", shard, name, flat_index, value)
    with pytest.raises(UserError) as refused:
        Session.load(folder, context=64, dtype="float32")
    assert str(refused.value) == (f"tensor '{name}' in {folder / shard} holds NaN or infinite values: the weights "
                                  "are damaged; download the model again")


def test_a_large_tensor_is_checked_at_its_start_middle_and_end(tiny_gpt_oss, tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "WHOLE_CHECK_ELEMENTS", 1000)  # the embedding (24 576 elements) is sampled
    monkeypatch.setattr(checkpoint, "SAMPLE_ELEMENTS", 100)
    name = "model.embed_tokens.weight"
    at_the_end = poisoned(tiny_gpt_oss, tmp_path / "end", DENSE_SHARD, name, 384 * 64 - 1, float("nan"))
    with pytest.raises(UserError, match=f"tensor '{name}'"):
        Session.load(at_the_end, context=64, dtype="float32")
    between_samples = poisoned(tiny_gpt_oss, tmp_path / "between", DENSE_SHARD, name, 5000, float("nan"))
    assert torch.isnan(load_file(between_samples / DENSE_SHARD)[name]).any()
    Session.load(between_samples, context=64, dtype="float32")  # a sample, not a full read: this one passes


def test_the_cli_says_which_tensor_in_one_line(tiny_gpt_oss, tmp_path, capsys):
    name = "model.layers.1.post_attention_layernorm.weight"
    folder = poisoned(tiny_gpt_oss, tmp_path / "model", DENSE_SHARD, name, 3, float("nan"))
    assert main(["generate", str(folder), "--prompt-ids", "1,2,3", "--max-new-tokens", "4"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"moechat: error: tensor '{name}' in {folder / DENSE_SHARD} holds NaN or infinite values: the "
                   "weights are damaged; download the model again"]
