"""`moechat generate` on every GLM model type, with a GLM-style tokenizer whose chat template opens
`<think>`: the reasoning comes out apart from the answer."""

import json
import shutil

import pytest
from transformers import AutoTokenizer

from app.cli import main
from app.model_folder import ModelFolder
from app.plan import ModelFacts
from tests.fixtures.tiny_glm import VARIANTS, write_tiny_glm
from tests.fixtures.tiny_tokenizer import write_think_tokenizer

END_THINK = 5  # "</think>" in the tiny think tokenizer


@pytest.fixture(scope="module")
def glm_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-glm")
    folders = {}
    for variant in VARIANTS:
        folders[variant] = write_tiny_glm(root / variant, variant)
        write_think_tokenizer(folders[variant])
    return folders


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("variant", VARIANTS)
def test_generate_chat_gives_reasoning_apart_from_the_answer(variant, glm_models, capsys):
    folder = glm_models[variant]
    code, out, err = run_cli(capsys, "generate", folder, "--chat", "--prompt", "What is the capital of France?",
                             "--max-new-tokens", "16", "--json")
    assert code == 0, err
    result = json.loads(out)
    ids = result["token_ids"]
    assert result["stats"]["prefill_tokens"] > 8  # the template wrapped the message and opened <think>
    thinking = ids[: ids.index(END_THINK)] if END_THINK in ids else ids
    answer = ids[len(thinking) + 1 :]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert result["reasoning"] == tokenizer.decode(thinking, skip_special_tokens=True)
    assert result["text"] == tokenizer.decode(answer, skip_special_tokens=True)
    assert result["reasoning"]


@pytest.mark.parametrize("model_type", ["glm4_moe", "glm4_moe_lite", "glm_moe_dsa"])
def test_generate_with_experts_offloaded(model_type, glm_models, capsys):
    code, out, _ = run_cli(capsys, "plan", glm_models[model_type], "--gpu-budget", "100G", "--ram-budget", "1G",
                           "--context", "16", "--dtype", "float32", "--json")
    plan = json.loads(out)
    fixed = plan["resident_bytes"] + plan["kv_cache_bytes"] + plan["workspace_bytes"]
    budget = fixed + 4 * plan["expert_bytes"]
    code, out, err = run_cli(capsys, "generate", glm_models[model_type], "--prompt-ids", "9,10,11,12,13,14",
                             "--max-new-tokens", "10", "--gpu-budget", str(budget), "--json")
    assert code == 0, err
    stats = json.loads(out)["stats"]
    assert stats["expert_cache"]["misses"] > 0
    assert stats["prefill_tokens"] == 6


def test_plan_counts_dense_fp8_weights_as_the_device_will_hold_them(glm_models, capsys):
    """On cuda the engine keeps dense FP8 weights FP8 (half of bf16); on cpu it dequantizes them."""
    resident = {}
    for device in ("cpu", "cuda"):
        code, out, err = run_cli(capsys, "plan", glm_models["glm4_moe_fp8"], "--gpu-budget", "100G", "--ram-budget",
                                 "1G", "--device", device, "--dtype", "bfloat16", "--json")
        assert code == 0, err
        resident[device] = json.loads(out)["resident_bytes"]
    folder = ModelFolder.open(glm_models["glm4_moe_fp8"])
    assert resident["cuda"] == ModelFacts.from_folder(folder, fp8_kept=True).resident_bytes(2)
    assert resident["cpu"] == ModelFacts.from_folder(folder).resident_bytes(2) > resident["cuda"]


def test_an_unsupported_quantization_is_one_error_line(glm_models, tmp_path, capsys):
    folder = shutil.copytree(glm_models["glm_moe_dsa_fp8"], tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["quant_method"] = "gptq"
    (folder / "config.json").write_text(json.dumps(config))
    code, out, err = run_cli(capsys, "generate", folder, "--prompt-ids", "1,2,3")
    assert code != 0
    assert out == ""
    assert err.strip().splitlines() == [
        f"moechat: error: quantization method 'gptq' in {folder / 'config.json'} is not supported; supported: "
        "mxfp4 (gpt-oss), fp8 with weight_block_size, compressed-tensors float-quantized per-channel FP8"
    ]
