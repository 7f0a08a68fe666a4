"""`moechat generate --spec dflash --drafter DIR | --spec mtp [--block-size N] --json` as a user runs it."""

import json

import pytest

from app.cli import main
from app.engine.models.dflash import open_dflash
from app.model_folder import ModelFolder
from app.plan import ModelFacts, plan_placement
from tests.fixtures.tiny_dflash import write_tiny_dflash
from tests.fixtures.tiny_glm import write_tiny_glm

PROMPT = ["--prompt-ids", "5,6,7,8,9,10", "--max-new-tokens", "12"]
CONTEXT = 6 + 12


@pytest.fixture(scope="module")
def drafter(tiny_gpt_oss, tmp_path_factory):
    return write_tiny_dflash(tmp_path_factory.mktemp("drafter"), json.loads((tiny_gpt_oss / "config.json").read_text()))


def budget_for_slots(model, slots: int, context: int = CONTEXT) -> int:
    """A float32 budget that leaves exactly `slots` expert slots for the target."""
    facts = ModelFacts.from_folder(ModelFolder.open(model))
    fixed = plan_placement(facts, None, None, context, 4)
    return fixed.resident_bytes + fixed.kv_cache_bytes + fixed.workspace_bytes + slots * facts.expert_bytes


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("block", [[], ["--block-size", "3"]], ids=["cost-aware", "block-3"])
def test_generate_json_with_dflash_reports_the_steps_and_keeps_the_tokens(tiny_gpt_oss, drafter, capsys, block):
    budget = budget_for_slots(tiny_gpt_oss, 4)
    code, out, _ = run_cli(capsys, "generate", tiny_gpt_oss, *PROMPT, "--gpu-budget", budget, "--json")
    assert code == 0
    plain = json.loads(out)
    folder, config = open_dflash(drafter)
    budget += config.device_bytes(folder, CONTEXT, "float32")  # the same 4 slots once the drafter is in
    code, out, err = run_cli(capsys, "generate", tiny_gpt_oss, *PROMPT, "--gpu-budget", budget, "--spec", "dflash",
                             "--drafter", drafter, *block, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["token_ids"] == plain["token_ids"]
    assert result["stop_reason"] == plain["stop_reason"]
    stats, spec = result["stats"], result["stats"]["spec"]
    assert spec["steps"] == len(spec["block_sizes"]) == len(spec["accepted_per_step"]) > 0
    assert all(0 <= kept < size for size, kept in zip(spec["block_sizes"], spec["accepted_per_step"], strict=True))
    assert spec["mean_accepted"] == pytest.approx(sum(spec["accepted_per_step"]) / spec["steps"])
    assert stats["decode_tokens"] <= sum(spec["accepted_per_step"]) + spec["steps"]
    assert stats["expert_cache"]["misses"] > 0
    if block:
        assert spec["policy"] == "fixed" and spec["block_sizes"][0] == 3


def test_generate_json_with_the_glm_mtp_layer_keeps_the_tokens(tmp_path, capsys):
    glm = write_tiny_glm(tmp_path / "glm", "glm4_moe")
    args = ["generate", glm, "--prompt-ids", "11,12,13,14", "--max-new-tokens", "10", "--json"]
    plain = json.loads(run_cli(capsys, *args)[1])
    code, out, err = run_cli(capsys, *args, "--spec", "mtp", "--block-size", "3")
    assert code == 0, err
    result = json.loads(out)
    assert result["token_ids"] == plain["token_ids"]
    assert result["stats"]["spec"]["block_sizes"][0] == 3


@pytest.mark.parametrize(("args", "message"), [
    (["--spec", "mtp"], "--spec mtp needs a model with its own MTP layer (GLM); this one is gpt_oss"),
    (["--spec", "mtp", "--drafter", "{drafter}"], "--spec mtp drafts with the model's own MTP layer"),
    (["--spec", "dflash"], "--spec dflash needs the drafter's folder: --drafter DIR"),
    (["--block-size", "4"], "--drafter and --block-size only apply with --spec dflash"),
    (["--drafter", "{drafter}"], "--drafter and --block-size only apply with --spec dflash"),
    (["--spec", "dflash", "--drafter", "{model}"], "is not a DFlash drafter"),
    (["--spec", "dflash", "--drafter", "{drafter}", "--block-size", "7"],
     "--block-size 7 is larger than the drafter's block size 6"),
    (["--spec", "dflash", "--drafter", "{drafter}", "--gpu-budget", "100K"], "the drafter alone needs"),
])
def test_bad_speculation_requests_give_one_clear_line(tiny_gpt_oss, drafter, capsys, args, message):
    args = [a.format(model=tiny_gpt_oss, drafter=drafter) for a in args]
    code, out, err = run_cli(capsys, "generate", tiny_gpt_oss, "--prompt-ids", "1,2,3", *args)
    assert code != 0
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert message in err
