"""`moechat generate` and `moechat plan` as a user runs them, bad input included."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from app.cli import main

SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def model_copy(tiny_gpt_oss, tmp_path):
    return shutil.copytree(tiny_gpt_oss, tmp_path / "model")


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_generate_json_from_token_ids_with_experts_offloaded(tiny_gpt_oss, capsys):
    code, out, _ = run_cli(capsys, "generate", tiny_gpt_oss, "--prompt-ids", "5,6,7,8,9,10",
                           "--max-new-tokens", "6", "--gpu-budget", "64.65M", "--json")
    assert code == 0
    result = json.loads(out)
    assert len(result["token_ids"]) <= 6
    assert result["stop_reason"] in ("stop", "length")
    stats = result["stats"]
    assert stats["prefill_tokens"] == 6
    assert stats["decode_tokens"] == len(result["token_ids"]) - 1
    assert stats["expert_cache"]["misses"] > 0
    assert stats["expert_cache"]["bytes_fetched"] > 0
    assert {"ttft_s", "decode_tok_s"} <= stats.keys()


def test_generate_chat_separates_reasoning_from_answer(tiny_gpt_oss, capsys):
    code, out, _ = run_cli(capsys, "generate", tiny_gpt_oss, "--chat", "--prompt", "Hello there",
                           "--max-new-tokens", "12", "--temperature", "0.8", "--seed", "3", "--json")
    assert code == 0
    result = json.loads(out)
    again = json.loads(run_cli(capsys, "generate", tiny_gpt_oss, "--chat", "--prompt", "Hello there",
                               "--max-new-tokens", "12", "--temperature", "0.8", "--seed", "3", "--json")[1])
    assert again["token_ids"] == result["token_ids"]  # seeded sampling reproduces the answer
    assert result["stats"]["prefill_tokens"] > 3  # the template wrapped the message


def test_console_script_streams_and_reports_errors_without_traceback(tiny_gpt_oss):
    ok = subprocess.run([sys.executable, "-m", "app", "generate", str(tiny_gpt_oss), "--prompt", "def main",
                         "--max-new-tokens", "4"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "tok/s" in ok.stderr
    bad = subprocess.run([sys.executable, "-m", "app", "generate", str(tiny_gpt_oss), "--prompt-ids", "1,2,100000"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines() == [
        "moechat: error: token id 100000 is outside the vocabulary (0 … 383)"
    ]


def break_missing_shard(folder):
    (folder / SHARD).unlink()


def break_truncated_shard(folder):
    data = (folder / SHARD).read_bytes()
    (folder / SHARD).write_bytes(data[: len(data) - 100])


def break_model_type(folder):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))


def break_tensor_shape(folder):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 64}))


def break_config_json(folder):
    (folder / "config.json").write_text("{ not json")


@pytest.mark.parametrize(("damage", "message"), [
    (break_missing_shard, f"checkpoint file {SHARD} is missing"),
    (break_truncated_shard, "is truncated"),
    (break_model_type, "model type 'llama'"),
    (break_tensor_shape, "has shape [8, 192, 2, 16] but this config needs [8, 128, 2, 16]"),
    (break_config_json, "is not valid JSON"),
])
def test_a_damaged_model_folder_gives_one_clear_line(model_copy, capsys, damage, message):
    damage(model_copy)
    code, out, err = run_cli(capsys, "generate", model_copy, "--prompt-ids", "1,2,3")
    assert code != 0
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("moechat: error: ")
    assert message in err


@pytest.mark.parametrize(("args", "message"), [
    (["--prompt-ids", "1,2,3", "--gpu-budget", "64K"], "GPU budget 64.00 KiB is too small"),
    (["--prompt-ids", "1,2,384"], "token id 384 is outside the vocabulary"),
    (["--prompt-ids", ""], "the prompt is empty"),
    (["--prompt", ""], "the prompt is empty"),
])
def test_bad_requests_give_one_clear_line(tiny_gpt_oss, capsys, args, message):
    code, out, err = run_cli(capsys, "generate", tiny_gpt_oss, *args)
    assert code != 0
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert message in err


def test_plan_prints_the_placement(tiny_gpt_oss, capsys):
    code, out, _ = run_cli(capsys, "plan", tiny_gpt_oss, "--gpu-budget", "99.1M", "--ram-budget", "200K",
                           "--dtype", "bfloat16", "--json")
    assert code == 0
    plan = json.loads(out)
    assert 0 < plan["expert_slots"] < plan["total_experts"]
    assert plan["host_experts"] == 200 * 1024 // plan["expert_bytes"]
    assert plan["disk_experts"] == plan["total_experts"] - plan["host_experts"]
    assert plan["device_bytes"] <= 99.1 * 1024 * 1024


@pytest.fixture
def tiny_glm_folder(tmp_path):
    from tests.fixtures.tiny_glm import write_tiny_glm

    return write_tiny_glm(tmp_path / "glm", "glm4_moe", mtp=False)


def test_plan_says_where_its_hit_rate_comes_from(tiny_gpt_oss, tiny_glm_folder, capsys):
    from app.paths import DEMO_MODEL

    sources = {}
    for folder in (tiny_gpt_oss, DEMO_MODEL, tiny_glm_folder):
        code, out, err = run_cli(capsys, "plan", folder, "--gpu-budget", "1G", "--ram-budget", "1G")
        assert code == 0, err
        sources[folder] = next(line for line in out.splitlines() if line.startswith("expert-cache hit rate"))
    assert "(gpt-oss-20b's real routing)" in sources[tiny_gpt_oss]  # the curve measured for gpt_oss models
    assert "(this model's measured routing)" in sources[DEMO_MODEL]  # the demo ships its routing.json
    assert "(uniform routing, the worst case)" in sources[tiny_glm_folder]


def test_plan_resolves_demo_and_predicts_the_cpu_as_the_app_does(capsys):
    """`moechat plan demo` plans the bundled demo (as `generate demo` runs it) and, on the CPU, predicts
    with the desktop app's rates: the same speed as the budget panel shows for the same plan."""
    from app.model_folder import ModelFolder
    from app.paths import DEMO_MODEL
    from app.plan import ModelFacts, plan_placement, predict_decode
    from app.ui.hardware import GIB, Machine

    code, out, err = run_cli(capsys, "plan", "demo", "--gpu-budget", "300M", "--ram-budget", "20M", "--json")
    assert code == 0, err
    plan = json.loads(out)
    facts = ModelFacts.from_folder(ModelFolder.open(DEMO_MODEL))
    machine = Machine(16 * GIB)  # no GPU: the app plans for the CPU, in float32
    app_placement = plan_placement(facts, 300 << 20, 20 << 20, 4096, 4)
    app_prediction = predict_decode(facts, app_placement, 4, machine.hardware)
    assert plan["expert_slots"] == app_placement.expert_slots
    assert plan["prediction"]["tok_s_low"] == pytest.approx(app_prediction.tok_s_low)
    assert 50 < plan["prediction"]["tok_s_low"] < 400  # the demo decodes ~130-200 tok/s on a 2-core CPU
    code, out, _ = run_cli(capsys, "plan", "demo", "--gpu-budget", "300M", "--ram-budget", "20M")
    assert "decode (CPU, 35 GB/s memory)" in out


def test_moechat_help_says_that_moechat_alone_opens_the_app(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "`moechat` with no command opens the desktop app" in " ".join(capsys.readouterr().out.split())


def test_plan_shows_the_cpu_tiers_experts_and_the_speed_with_and_without_it(tmp_path, capsys, monkeypatch):
    """On a 16-core host, a GPU on PCIe Gen3 missing most of gpt-oss-20b's experts: the planner is the oracle."""
    from app import cli_arguments
    from app.model_folder import ModelFolder
    from app.plan import PCIE_BPS, Hardware, ModelFacts
    from app.plan_gpus import plan_budgets, predict_gpus
    from tests.fixtures.shape_only import write_shape_only_model

    monkeypatch.setattr(cli_arguments, "host_cores", lambda: 16)
    folder = write_shape_only_model(tmp_path / "20b")
    flags = ["plan", folder, "--gpu-budget", "6G", "--ram-budget", "32G", "--device", "cuda", "--pcie-gen", "3"]
    code, out, err = run_cli(capsys, *flags, "--cpu-threads", "14", "--json")
    assert code == 0, err
    plan = json.loads(out)
    facts = ModelFacts.from_folder(ModelFolder.open(folder), fp8_kept=True)
    placement, gpus = plan_budgets(facts, 6 << 30, 32 << 30, 4096, 2)
    hardware = Hardware(link_bps=PCIE_BPS[3])
    assert plan["cpu_threads"] == 14 and plan["cpu_tier_idle"] is None
    assert plan["prediction"] == predict_gpus(facts, placement, gpus, 2, hardware, cpu_threads=14).as_dict()
    assert plan["prediction_without_cpu_tier"] == predict_gpus(facts, placement, gpus, 2, hardware).as_dict()
    with_tier, without = plan["prediction"], plan["prediction_without_cpu_tier"]
    assert with_tier["cpu_experts_per_token"] > 0 == without["cpu_experts_per_token"]
    assert with_tier["tok_s_low"] > without["tok_s_low"]
    code, out, _ = run_cli(capsys, *flags, "--cpu-threads", "14")
    lines = dict(re.split(r" {2,}", line, maxsplit=1) for line in out.splitlines() if "  " in line)
    with_tier, without = (predict_gpus(facts, placement, gpus, 2, hardware, cpu_threads=t) for t in (14, 0))
    assert lines["CPU expert tier (14 threads)"] == f"{with_tier.cpu_experts_per_token:.1f} experts/token"
    assert lines["decode without the CPU tier"] == f"{without.tok_s_low:.1f}–{without.tok_s_high:.1f} tok/s"
    code, out, _ = run_cli(capsys, *flags)
    assert "CPU expert tier" not in out  # asked for none: the plan as before, and the tier suggested
    suggested = predict_gpus(facts, placement, gpus, 2, hardware, cpu_threads=15)
    assert f"with --cpu-threads 15 (the CPU computing part of the misses): {suggested.tok_s_low:.1f}–" \
           f"{suggested.tok_s_high:.1f} tok/s" in out
    code, out, _ = run_cli(capsys, "plan", folder, "--gpu-budget", "20G", "--ram-budget", "0", "--device", "cuda")
    assert code == 0 and "--cpu-threads" not in out  # every expert on the GPU: nothing to suggest


def test_plan_on_the_cpu_says_why_the_tier_computes_nothing(tiny_gpt_oss, capsys):
    code, out, err = run_cli(capsys, "plan", tiny_gpt_oss, "--gpu-budget", "1G", "--ram-budget", "1G",
                             "--cpu-threads", "1")
    assert code == 0, err
    assert "CPU expert tier (1 thread)" in out and "0.0 experts/token" in out
    assert "computes no experts here: no GPU: the CPU computes every expert already" in out


def test_generate_and_serve_pass_the_cpu_threads_to_the_engine_which_on_the_cpu_changes_nothing(
        tiny_gpt_oss, capsys, monkeypatch, threads_loaded):
    from app.server import serve

    results = []
    for threads in ("0", "1"):
        code, out, err = run_cli(capsys, "generate", tiny_gpt_oss, "--prompt-ids", "5,6,7,8,9,10", "--max-new-tokens",
                                 "6", "--gpu-budget", "64.65M", "--cpu-threads", threads, "--json")
        assert code == 0, err
        results.append(json.loads(out))
    assert threads_loaded == [0, 1]
    assert results[0]["token_ids"] == results[1]["token_ids"]
    assert results[1]["stats"]["expert_cache"]["misses"] > 0 == results[1]["stats"]["expert_cache"]["cpu_computed"]
    served = []
    monkeypatch.setattr(serve, "serve", lambda request, options: served.append(request))
    assert run_cli(capsys, "serve", tiny_gpt_oss, "--cpu-threads", "1")[0] == 0
    assert served[0].cpu_threads == 1
