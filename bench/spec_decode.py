"""Batch-1 speculative decode of a synthetic gpt-oss checkpoint (real shapes and formats, random
weights) at GPU budgets that hold 100 %, 50 % and 25 % of the routed experts: tok/s with speculation
off, with fixed block sizes, and with the cost-aware policy, at forced acceptance rates.

    python bench/spec_decode.py OUT.json [--model 20b|120b] [--prompt 512] [--new 128]
        [--acceptance 0.3,0.6,0.9] [--blocks 2,4,8] [--fractions 1.0,0.5,0.25] [--repeats 2]
        [--prefetch-layers N]
    python bench/spec_decode.py OUT.json --device cpu --tiny     (the whole pipeline on a tiny model)

Random weights accept nothing, so each run wraps a synthetic DFlash drafter of the published shape
(its pass still runs, so steps cost what they would) in `AgreeingDrafter`, whose drafts agree with the
target's greedy continuation (known from the spec-off run) with probability a. Greedy speculation must
emit exactly the spec-off tokens; every run records whether it did. The target's LM head is a permutation
of its embedding (see `write_tiny_gpt_oss`): with a fully random head, bf16 rounding differences between
a one-token step and a verify block flip near-tied argmaxes, the continuation leaves the one the drafter
agrees with, and the forced acceptance is lost to numerics. Its experts are zeros in a sparse file (copy and
kernel times do not depend on the values; writing 12 GB of random bytes would cost a minute of GPU time).
The expert slots are the same with and without speculation; the drafter's device bytes are reported beside
them, and so is one draft's time (`drafter_pass_ms`: a block drafted after the prompt; on a GPU its kernels,
`drafter_pass_kernels`). `--blocks ""` runs the cost-aware policy and spec off only.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.generation.generate import generate
from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.loader import load_model
from app.engine.runner.step_runner import StepRunner
from app.engine.spec.dflash import DFlashSpeculation
from app.engine.spec.generate import speculative_generate
from app.model_folder import ModelFolder
from app.plan import ModelFacts
from app.protocol.events import Done, Tokens
from bench.decode_gpt_oss import REAL_SIZES, SHAPES, copy_bandwidths, cpu_machine, expert_budget, machine
from bench.profile_decode_step import kernel_table
from tests.fixtures.agreeing_drafter import AgreeingDrafter
from tests.fixtures.tiny_dflash import write_tiny_dflash
from tests.fixtures.tiny_gpt_oss import write_tiny_gpt_oss

# A Qwen3-style drafter of ~0.8B parameters, as published for gpt-oss (8 layers; block 8 for 20b, 10 for 120b)
DRAFTER_SHAPES = {"num_hidden_layers": 8, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                  "intermediate_size": 7680}
DRAFTERS = {
    "20b": {"block_size": 8, "target_layer_ids": (1, 6, 11, 16, 21), "mask_token_id": 200000},
    "120b": {"block_size": 10, "target_layer_ids": (1, 9, 17, 25, 33), "mask_token_id": 200000},
    "tiny": {"block_size": 6, "target_layer_ids": (0, 2), "mask_token_id": 300},
}


def write_checkpoints(folder: Path, model: str) -> tuple[Path, Path]:
    target, drafter = folder / "target", folder / "drafter"
    if not (target / "config.json").exists():
        if model == "tiny":
            write_tiny_gpt_oss(target)
        else:
            write_tiny_gpt_oss(target, scale_exponents=(116, 119), permuted_head=True, hollow_experts=True,
                               **REAL_SIZES[model], **SHAPES)
    if not (drafter / "config.json").exists():
        shapes = {} if model == "tiny" else DRAFTER_SHAPES
        write_tiny_dflash(drafter, json.loads((target / "config.json").read_text()), **DRAFTERS[model], **shapes)
    return target, drafter


def tokens_and_stats(events) -> tuple[list[int], dict]:
    """The tokens, and Done's stats as the CLI's --json gives them, with `step_ms`: each step after the first
    token as (its block size, 1 for a plain one; milliseconds since the event before it)."""
    tokens, done, steps = [], None, []
    last = None
    for event in events:
        now = time.perf_counter()
        if isinstance(event, Tokens):
            if last is not None:
                steps.append((event.spec.block_size if event.spec else 1, (now - last) * 1e3))
            tokens += event.token_ids
            last = now
        elif isinstance(event, Done):
            done = event
    return tokens, {**done.stats.as_dict(), "step_ms": steps}


def budget_runs(target: Path, drafter: Path, fraction: float, args, device: str, dtype: str,
                fetch_bandwidth: float | None) -> dict:
    facts = ModelFacts.from_folder(ModelFolder.open(target))
    context = args.prompt + args.new
    budget = expert_budget(facts, fraction, context, 2 if dtype == "bfloat16" else 4)
    on_gpu = device == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    model = load_model(ModelFolder.open(target), device=device, dtype=dtype, context=context, gpu_budget=budget,
                       prefetch_layers=args.prefetch_layers).model
    memory = {"after_target_load": allocated_since(base)} if on_gpu else {}
    speculation = DFlashSpeculation(drafter, None)
    speculation.load(model)
    if on_gpu:
        memory["after_drafter_load"] = allocated_since(base)
    ids = torch.randint(0, facts.vocab_size, (args.prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    greedy = SamplingParams()
    runner = StepRunner(model, context)  # one for every run, as a session keeps one

    def plain() -> tuple[list[int], dict]:
        sampler = Sampler(greedy, model.device)
        return tokens_and_stats(generate(runner, ids, sampler, args.new, []))

    def speculative(agreement: float, block_size: int | None, seed: int) -> tuple[list[int], dict]:
        drafter = AgreeingDrafter(speculation.new_drafter(context), len(ids), reference, agreement,
                                  facts.vocab_size, seed)
        sampler = Sampler(greedy, model.device)
        return tokens_and_stats(speculative_generate(runner, ids, sampler, args.new, [], drafter, block_size,
                                                     fetch_bandwidth))

    reference, _ = plain()  # warm-up, and the continuation every drafter agrees with
    off = [plain()[1] for _ in range(args.repeats)]
    if on_gpu:
        peak = memory["through_spec_off"] = torch.cuda.max_memory_allocated() - base
    result = {
        "budget_fraction_of_routed_experts": fraction,
        "gpu_budget_bytes": budget,
        "expert_slots": model.experts.num_slots,
        "drafter_device_bytes": speculation.config.device_bytes(speculation.folder, context, dtype),
        "off": summarize(off, facts),
        "spec": [],
    }
    for agreement in args.acceptance:
        for block_size in [*args.blocks, None]:
            runs = []
            if on_gpu:
                torch.cuda.reset_peak_memory_stats()
            for repeat in range(args.repeats):
                tokens, stats = speculative(agreement, block_size, seed=repeat)
                runs.append({**stats, "tokens_match": tokens == reference})
            entry = {"acceptance": agreement, "block_size": block_size or "cost-aware", **summarize(runs, facts)}
            if block_size is None:  # the policy's steps in order: where its plain streaks wait and what probes cost
                entry["step_ms"] = [[size, round(ms, 3)] for size, ms in median_run(runs)["step_ms"]]
            if on_gpu:
                entry["memory"] = {"peak": torch.cuda.max_memory_allocated() - base, "after": allocated_since(base)}
                peak = max(peak, entry["memory"]["peak"])
            result["spec"].append(entry)
            print(json.dumps({"fraction": fraction, **{k: v for k, v in entry.items() if not isinstance(v, dict)}}),
                  flush=True)
    seconds, kernels = drafter_pass(speculation, context, len(ids), Sampler(greedy, model.device))
    result["drafter_pass_ms"] = seconds * 1e3
    if on_gpu:  # target, drafter, expert slots, verify and drafter graph pools, every run's caches
        result["memory_bytes"] = memory
        result["max_memory_allocated_bytes"] = peak
        result["within_budget_plus_drafter"] = peak <= budget + result["drafter_device_bytes"]
        result["drafter_pass_kernels"] = [{"name": name[:160], "us": us, "launches": n} for name, us, n in kernels]
    return result


def drafter_pass(speculation: DFlashSpeculation, context: int, committed: int, sampler: Sampler,
                 repeats: int = 20) -> tuple[float, list[tuple[str, float, float]]]:
    """One draft of a whole block after `committed` positions (its CUDA graph where there is one), the host's
    read of the drafts included: the drafter's share of a speculative step. On a GPU also the kernels of the same
    draft run eagerly (`kernel_table`: the ones its graph replays), else none."""
    proposer = speculation.new_drafter(context)
    drafter = speculation.drafter
    width = len(proposer.target_layers) * drafter.config.hidden_size
    proposer.commit(list(range(committed)), torch.zeros(committed, width, dtype=drafter.dtype, device=drafter.device))
    proposer.propose(0, proposer.block_size - 1, sampler)  # takes the context in; warms up
    started = time.perf_counter()
    for _ in range(repeats):
        proposer.propose(0, proposer.block_size - 1, sampler)
    seconds = (time.perf_counter() - started) / repeats
    kernels = []
    if drafter.device.type == "cuda":
        block = torch.full((proposer.block_size,), drafter.config.mask_token_id, device=drafter.device)
        kernels = kernel_table(lambda _: drafter.draft(block, proposer.context), repeats)
    speculation.release(proposer)
    return seconds, kernels


def allocated_since(base: int) -> int:
    return torch.cuda.memory_allocated() - base


def median_run(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["decode_tok_s"])[(len(runs) - 1) // 2]


def summarize(runs: list[dict], facts: ModelFacts) -> dict:
    """The median run by decode tok/s (the slower one of two), with every run's tok/s and, for
    speculation, what the steps did."""
    run = median_run(runs)
    cache, tokens = run["expert_cache"], max(run["decode_tokens"], 1)
    figures = {
        "decode_tok_s": run["decode_tok_s"],
        "decode_tok_s_runs": [r["decode_tok_s"] for r in runs],
        "misses_per_token": cache["misses"] / tokens,
        "bytes_fetched_per_token": cache["bytes_fetched"] / tokens,
        "prefetch_coverage": cache["prefetch_coverage"],
        "prefetch_waste": cache["prefetch_waste"],
        "step_ms_by_block_size": step_times(run["step_ms"]),
    }
    if "spec" in run:
        spec = run["spec"]
        figures.update({
            "tokens_match": all(r["tokens_match"] for r in runs),
            "steps": spec["steps"],
            "tokens_per_step": (spec["mean_accepted"] + 1),
            "mean_block_size": statistics.fmean(spec["block_sizes"]) if spec["steps"] else 0.0,
            "block_size_counts": {str(b): spec["block_sizes"].count(b) for b in sorted(set(spec["block_sizes"]))},
            "experts_touched_per_step_per_layer": (cache["hits"] + cache["misses"]) / max(spec["steps"], 1)
            / len(facts.moe_layers),
        })
    return figures


def step_times(steps: list[tuple[int, float]]) -> dict:
    """Per block size: how many steps, their median and their total milliseconds (the events' spacing: a step's
    host and device work, and for steps run ahead the interval between two reads)."""
    by_size = defaultdict(list)
    for size, ms in steps:
        by_size[size].append(ms)
    return {str(size): {"steps": len(times), "median_ms": statistics.median(times), "total_ms": sum(times)}
            for size, times in sorted(by_size.items())}


def verdicts(runs: list[dict]) -> list[dict]:
    """Per budget and acceptance: the policy against spec off (issue 5: never more than 5 % slower) and
    against the best fixed block size (it must win at some budget)."""
    rows = []
    for run in runs:
        off = run["off"]["decode_tok_s"]
        for agreement in sorted({entry["acceptance"] for entry in run["spec"]}):
            entries = [e for e in run["spec"] if e["acceptance"] == agreement]
            policy = next(e for e in entries if e["block_size"] == "cost-aware")
            best = max((e for e in entries if e["block_size"] != "cost-aware"), key=lambda e: e["decode_tok_s"],
                       default={"block_size": None, "decode_tok_s": float("nan")})  # --blocks "": the policy only
            rows.append({
                "budget_fraction": run["budget_fraction_of_routed_experts"],
                "acceptance": agreement,
                "off_tok_s": off,
                "cost_aware_tok_s": policy["decode_tok_s"],
                "best_fixed_block": best["block_size"],
                "best_fixed_tok_s": best["decode_tok_s"],
                "cost_aware_over_off": policy["decode_tok_s"] / off,
                "cost_aware_over_best_fixed": policy["decode_tok_s"] / best["decode_tok_s"],
                "all_tokens_match": all(e["tokens_match"] for e in entries),
            })
    return rows


def numbers(text: str, kind=float) -> list:
    return [kind(part) for part in text.split(",") if part]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--model", choices=sorted(REAL_SIZES), default="20b")
    parser.add_argument("--tiny", action="store_true", help="the tiny test model and drafter instead (CPU checks)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--prompt", type=int)
    parser.add_argument("--new", type=int)
    parser.add_argument("--acceptance", type=numbers, default=[0.3, 0.6, 0.9])
    parser.add_argument("--blocks", type=lambda text: numbers(text, int), help="fixed block sizes (default 2,4,B)")
    parser.add_argument("--fractions", type=numbers, default=[1.0, 0.5, 0.25])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prefetch-layers", type=int, default=0,
                        help="look-ahead depth: also how many first layers a verify prefetches before it starts")
    parser.add_argument("--folder", help="reuse synthetic checkpoints written earlier")
    args = parser.parse_args()
    model = "tiny" if args.tiny else args.model
    args.prompt = args.prompt or (32 if args.tiny else 512)
    args.new = args.new or (48 if args.tiny else 128)
    args.blocks = [2, 4, DRAFTERS[model]["block_size"]] if args.blocks is None else args.blocks
    dtype = "bfloat16" if args.device == "cuda" else "float32"

    report = {"command": " ".join(sys.argv), "model": f"synthetic gpt-oss-{model}", "dtype": dtype,
              "machine": machine() if args.device == "cuda" else cpu_machine(),
              "routing": "random weights: near-uniform routing, the worst case for a cache",
              "drafter": {"shape": DRAFTER_SHAPES if model != "tiny" else "tests/fixtures/tiny_dflash.py",
                          **DRAFTERS[model], "acceptance_forced_by": "tests/fixtures/agreeing_drafter.py"}}
    fetch_bandwidth = None
    if args.device == "cuda":
        report["bandwidth"] = copy_bandwidths()
        fetch_bandwidth = report["bandwidth"]["pcie_pinned_13MB_chunks_Bps"]
        torch.cuda.empty_cache()
    report["policy_fetch_bandwidth_prior_Bps"] = fetch_bandwidth
    folder = Path(args.folder or tempfile.mkdtemp(prefix=f"spec-{model}-", dir="/tmp"))
    started = time.perf_counter()
    target, drafter = write_checkpoints(folder, model)
    report["checkpoint_write_s"] = time.perf_counter() - started
    report["runs"] = []
    for fraction in args.fractions:
        report["runs"].append(budget_runs(target, drafter, fraction, args, args.device, dtype, fetch_bandwidth))
        if args.device == "cuda":
            torch.cuda.empty_cache()  # the last budget's model is gone: give its memory back before the next
        report["verdicts"] = verdicts(report["runs"])
        Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"{'budget':>7} {'a':>4} {'off':>8} {'policy':>8} {'best fixed':>12} {'pol/off':>8} {'pol/best':>9} match")
    for row in report["verdicts"]:
        print(f"{row['budget_fraction']:>7.2f} {row['acceptance']:>4.1f} {row['off_tok_s']:>8.1f} "
              f"{row['cost_aware_tok_s']:>8.1f} {row['best_fixed_tok_s']:>8.1f} (B{row['best_fixed_block']}) "
              f"{row['cost_aware_over_off']:>8.2f} {row['cost_aware_over_best_fixed']:>9.2f} {row['all_tokens_match']}")
    for run in report["runs"]:
        kernels = run.get("drafter_pass_kernels", [])
        print(f"drafter pass {run['drafter_pass_ms']:.2f} ms at budget {run['budget_fraction_of_routed_experts']:.2f}; "
              f"eager kernels {sum(k['us'] for k in kernels):.0f} us:")
        for kernel in kernels[:12]:
            print(f"{kernel['us']:9.1f} us {kernel['launches']:5.1f}x  {kernel['name'][:100]}")


if __name__ == "__main__":
    main()
