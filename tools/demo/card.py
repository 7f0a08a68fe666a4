"""The demo model's card (resources/models/README.md), written from training.json, evaluation.json and
the benchmark results bench/results/demo-model-*.json, so that every number in it has a source file."""

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def write_card(folder: Path) -> Path:
    training = json.loads((folder / "training.json").read_text())
    evaluation = json.loads((folder / "evaluation.json").read_text())
    target, drafter, data = training["target"], training["drafter"], training["data"]
    sizes = {name: sum(f.stat().st_size for f in (folder / name).glob("*.safetensors"))
             for name in ("demo-gpt-oss", "demo-gpt-oss-dflash")}
    c, d = target["config"], drafter["config"]
    routing = evaluation["routing"]
    mean = routing["mean_over_layers"]
    engine = routing["engine_cache_hit_rate"]
    reports = _bench_reports()
    sampling = json.loads((folder / "demo-gpt-oss" / "generation_config.json").read_text())
    lines = [
        "# MoE Chat demo model: `demo-gpt-oss` + `demo-gpt-oss-dflash`",
        "",
        "A small GPT-OSS-architecture mixture of experts and its DFlash drafter, trained by this project "
        "(`tools/train_demo.py`) so that the app chats out of the box and speculation is measured on real "
        "weights. It answers questions about the Python standard library in the style of its docstrings and "
        "source; it is a demo, not an assistant: expect plausible, often wrong text.",
        "",
        "    moechat generate demo --chat --prompt \"What does \\`json.dumps\\` do?\"",
        "    moechat generate demo --chat --prompt \"How is \\`textwrap.dedent\\` implemented?\" "
        "--spec dflash --drafter demo --block-size 8",
        "",
        "## Sampling",
        f"`demo-gpt-oss/generation_config.json` asks for temperature {sampling['temperature']}, top-p "
        f"{sampling['top_p']} and at most {sampling['max_new_tokens']} new tokens, and the desktop app starts a "
        "chat with the demo that way: at temperature 1.0 its answers fall apart into word salad.",
        "",
        "## Data",
        f"The docstrings and source code of Python {training['python']}'s standard library and the pydoc "
        f"language topics (PSF licence), shaped as question → answer chats in the harmony format: {data['items']} "
        f"items, {data['training_chats']} training chats ({data['training_tokens']:,} tokens), "
        f"{data['heldout_chats']} held out (4 % of items by a hash of their name; `demo-gpt-oss/heldout.json`).",
        "",
        "## Sizes",
        "| | target (`demo-gpt-oss`) | drafter (`demo-gpt-oss-dflash`) |",
        "|---|---|---|",
        f"| layers | {c['num_hidden_layers']} (sliding window {c['sliding_window']} on every other one, "
        f"attention sinks, YaRN) | {d['num_hidden_layers']} (Qwen3-style, reads target layers "
        f"{drafter['target_layer_ids']}) |",
        f"| hidden / heads (q, kv) / head dim | {c['hidden_size']} / {c['num_attention_heads']}, "
        f"{c['num_key_value_heads']} / {c['head_dim']} | {c['hidden_size']} / {d['num_attention_heads']}, "
        f"{d['num_key_value_heads']} / {d['head_dim']} |",
        f"| experts | {c['num_local_experts']} routed, top-{c['num_experts_per_tok']}, width "
        f"{c['intermediate_size']}, MXFP4 | — (MLP width {d['intermediate_size']}) |",
        f"| vocabulary | {c['vocab_size']} (byte-level BPE, harmony special tokens) | the target's embedding and "
        f"LM head; block size {d['block_size']} |",
        f"| on disk | {sizes['demo-gpt-oss'] / 1e6:.1f} MB | {sizes['demo-gpt-oss-dflash'] / 1e6:.1f} MB |",
        "",
        "## Training",
        f"Seed {training['seed']}, on one {training['device']} (torch {training['torch']}):",
        *[f"- `{command}`" for command in training.get("commands", [training.get("command")])],
        f"- wall time: {training['seconds']['target_run']} s for the first command (its target phase, then a "
        f"drafter that the second replaced) and {training['seconds']['drafter_run']} s for the second.",
        f"- target: {target['steps']} steps of {target['settings']['batch']} × {target['settings']['sequence']} "
        f"packed tokens ({target['epochs']} epochs), AdamW lr {target['settings']['learning_rate']} "
        f"(warm-up {target['settings']['warmup']}, cosine to a tenth), weight decay "
        f"{target['settings']['weight_decay']}, router balance loss {target['settings']['router_aux_loss_coef']}; "
        f"experts rounded to MXFP4 in the forward pass (straight-through) from step {target['quantized_from_step']}; "
        f"final training loss {target['final_train_loss']:.3f}; {target['seconds']} s.",
        f"- drafter: the target's own answers, {drafter['greedy_continuations']} greedy (to training prompts "
        f"interleaved with {drafter['invented_prompts']} prompts about names that do not exist) and "
        f"{drafter['sampled_continuations']} at temperature 0.7 (training prompts); {drafter['steps']} steps of "
        f"{drafter['settings']['batch']} sequences × {drafter['settings']['anchors']} anchor blocks of 16 (as many "
        "block tokens at blocks of 8 and 4), block sizes cycling 16 / 8 / 4; loss: cross-entropy against the "
        "target's next-token distribution at each block position, weighted exp(-(k-1)/γ) by position; final "
        f"weighted loss {drafter['final_weighted_loss']:.3f}; {drafter['seconds']} s (of which "
        f"{drafter['target_outputs_seconds']} s computed the target's features and logits along every answer once). "
        f"{drafter.get('note', '')}",
        "",
        "## Measured",
        f"- Held-out perplexity of the answers: **{evaluation['heldout_perplexity']}** over "
        f"{evaluation['heldout_answers']} answers ({evaluation['heldout_answer_tokens']:,} tokens), from the "
        "shipped MXFP4 checkpoint (transformers, float32, CPU).",
        f"- Greedy DFlash acceptance τ (tokens per verify step) on {evaluation['greedy_tau']['prompts']} held-out "
        f"prompts, answers up to {evaluation['greedy_tau']['max_new_tokens']} tokens, float32: "
        + ", ".join(f"block {size}: **{tau}**" for size, tau in evaluation["greedy_tau"]["tau"].items())
        + ". The target was τ ≥ 3 at block 8" + (": missed." if evaluation["greedy_tau"]["tau"]["8"] < 3 else ": met."),
        "",
        "Engine runs (`bench/demo_model.py`, τ and decode speed, speculation off and on), each on the first "
        "prompts of the held-out set (the prompts column). Acceptance differs widely from prompt to prompt, so a "
        "run's τ and speed-ups hold for its own prompts; the runs on the most prompts are the wider measure.",
        "",
        "| machine | dtype | prompts × max tokens | spec | block | temperature | τ | decode tok/s (mean) |",
        "|---|---|---|---|---|---|---|---|",
        *_bench_rows(reports),
        "",
        "Each result file records the machine's load average when it ran.",
        *_bench_notes(reports),
        "",
        f"- Routing over the held-out chats ({routing['tokens']:,} tokens, {routing['experts']} experts, "
        f"top-{routing['top_k']}), mean over layers: the most popular expert gets "
        f"{mean['largest_share_times_experts']}× its uniform share, normalised entropy "
        f"{mean['normalised_entropy']}, the top quarter of experts takes {mean['top_quarter_share']:.0%} of picks; "
        f"a token reuses {mean['reuse_with_previous_token']:.0%} of the previous token's experts (uniform: "
        f"{routing['uniform_reuse']:.0%}). The engine's expert cache of "
        + " / ".join(routing["cache_hit_rate"]["lru"]) + " experts per layer (shared by the layers), replayed "
        f"over these picks, hits {_rates(routing['cache_hit_rate'])} (its eviction policy: "
        f"{routing['cache_hit_rate']['policy']}); the planner's uniform-routing model predicts "
        + " / ".join(f"{rate:.0%}" for rate in routing["planner_uniform_hit_rate"].values()) + ". While the "
        f"engine itself answers {engine['prompts']} held-out prompts ({engine['max_new_tokens']} tokens each, "
        f"prefill and decode) it hits {_rates(engine)}. The planner reads the policy's replayed rates "
        "(`demo-gpt-oss/routing.json`).",
        "",
        "Files: `training.json` (settings and counts as run), `evaluation.json` (the measurements above, per "
        "layer), `bench/results/demo-model-*.json` (engine runs).",
    ]
    path = folder / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _rates(measured: dict) -> str:
    """"policy / … against LRU's lru / …" as percentages with one decimal (the differences are small)."""
    ours = " / ".join(f"{rate:.1%}" for rate in measured["engine_policy"].values())
    return f"{ours} against LRU's " + " / ".join(f"{rate:.1%}" for rate in measured["lru"].values())


def _bench_reports() -> list[tuple[str, dict]]:
    return [(result.name, json.loads(result.read_text())) for result in sorted(RESULTS.glob("demo-model-*.json"))]


def _bench_notes(reports: list[tuple[str, dict]]) -> list[str]:
    """What a result file says of its own runs (its "note"), quoted under the table."""
    return [line for name, report in reports if report.get("note")
            for line in ("", f"`bench/results/{name}`: {report['note']}")]


def _bench_rows(reports: list[tuple[str, dict]]) -> list[str]:
    rows = []
    for _, report in reports:
        machine = report["machine"].get("gpu") or f"CPU ({report['machine']['cpu_count']} cores)"
        for run in report["runs"]:
            tau = f"{run['tau']:.2f}" if "tau" in run else "—"
            rows.append(f"| {machine} | {report['model']['dtype']} | {report['prompts']} × "
                        f"{report['max_new_tokens']} | {run['spec']} | {run['block_size'] or '—'} | "
                        f"{run['temperature']} | {tau} | {run['decode_tok_s_mean']:.1f} |")
    return rows
