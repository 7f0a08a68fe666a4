"""Batch-1 decode of a synthetic gpt-oss checkpoint on one GPU and with the routed experts spread over
two (expert parallel), at the same per-GPU budget: the one-GPU budget that holds a given fraction of
the routed experts besides everything else, once for one GPU and once for each of two. Floors from
the same run: each GPU's pinned PCIe copy rate (alone, and both links at once) and HBM copy.

    python bench/decode_multi_gpu.py OUT.json [--folder DIR] [--fractions 0.125,0.25] [--new 128]

Random weights route almost uniformly: the worst case for an expert cache.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.loader import load_model
from app.model_folder import ModelFolder
from app.plan import ModelFacts
from bench.decode_gpt_oss import REAL_SIZES, SHAPES, _timed_generation, expert_budget, machine
from tests.fixtures.tiny_gpt_oss import write_tiny_gpt_oss

CHUNK = 13_240_000  # about one gpt-oss expert
CHUNKS = 48


def pcie_bandwidths(devices: list[int]) -> dict:
    """Pinned host -> device copies of expert-sized chunks, per GPU alone and on all GPUs at once."""
    hosts = {d: torch.empty(CHUNKS * CHUNK, dtype=torch.uint8, pin_memory=True) for d in devices}
    targets = {d: torch.empty_like(hosts[d], device=f"cuda:{d}") for d in devices}
    streams = {d: torch.cuda.Stream(f"cuda:{d}") for d in devices}

    def copy(on: list[int]) -> float:
        for d in on:
            torch.cuda.synchronize(d)
        started = time.perf_counter()
        for i in range(CHUNKS):
            for d in on:
                with torch.cuda.stream(streams[d]):
                    targets[d][i * CHUNK : (i + 1) * CHUNK].copy_(hosts[d][i * CHUNK : (i + 1) * CHUNK],
                                                                  non_blocking=True)
        for d in on:
            torch.cuda.synchronize(d)
        return len(on) * CHUNKS * CHUNK / (time.perf_counter() - started)

    def median(on: list[int]) -> float:
        copy(on)
        return sorted(copy(on) for _ in range(5))[2]

    return {**{f"pcie_pinned_gpu{d}_Bps": median([d]) for d in devices}, "pcie_pinned_all_at_once_Bps": median(devices)}


def decode_run(folder: Path, budgets: tuple[int, ...], prompt: int, new: int, facts: ModelFacts) -> dict:
    devices = range(len(budgets))
    for d in devices:
        torch.cuda.reset_peak_memory_stats(d)
    base = [torch.cuda.memory_allocated(d) for d in devices]
    loaded = load_model(ModelFolder.open(folder), device="cuda", dtype="bfloat16", context=prompt + new,
                        gpu_budget=budgets if len(budgets) > 1 else budgets[0], ram_budget=None)
    model = loaded.model
    shards = getattr(model.experts, "shards", [model.experts])
    ids = torch.randint(0, facts.vocab_size, (prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    runs, per_gpu_fetched = [], []
    for _ in range(3):
        before = [shard.snapshot() for shard in shards]
        runs.append(_timed_generation(model, ids, new))
        per_gpu_fetched.append([shard.snapshot().since(b).bytes_fetched for shard, b in zip(shards, before,
                                                                                            strict=True)])
    peaks = [torch.cuda.max_memory_allocated(d) - base[d] for d in devices]
    slowest = min(range(1, 3), key=lambda i: runs[i]["decode_tok_s"])  # the slower of the two warm runs
    slots = [p.expert_slots for p in loaded.gpu_placements] or [loaded.placement.expert_slots]
    del model, loaded, shards
    torch.cuda.empty_cache()
    return {
        "gpus": len(budgets),
        "gpu_budget_bytes_per_gpu": list(budgets),
        "expert_slots_per_gpu": slots,
        "expert_slots": sum(slots),
        "decode_tok_s_runs": [r["decode_tok_s"] for r in runs],
        **runs[slowest],
        "bytes_fetched_per_gpu_in_run": per_gpu_fetched[slowest],  # prefill included
        "max_memory_allocated_bytes_per_gpu": peaks,
        "within_budget": all(peak <= budget for peak, budget in zip(peaks, budgets, strict=True)),
    }


def pcie_floor_s(run: dict, bandwidth: dict) -> float:
    """Per token, the misses copied over the links at the rate measured with all of them busy (or alone)."""
    rate = bandwidth["pcie_pinned_all_at_once_Bps"] if run["gpus"] > 1 else bandwidth["pcie_pinned_gpu0_Bps"]
    return run["decode_bytes_fetched_per_token"] / rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--model", choices=sorted(REAL_SIZES), default="20b")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--fractions", default="0.125,0.25", help="of the routed experts in one GPU's budget")
    parser.add_argument("--folder", help="reuse a synthetic checkpoint written earlier")
    args = parser.parse_args()
    gpus = torch.cuda.device_count()
    if gpus < 2:
        sys.exit(f"decode_multi_gpu: needs two CUDA GPUs, found {gpus}")

    report = {"command": " ".join(sys.argv), "machine": machine(), "model": f"synthetic gpt-oss-{args.model}",
              "routing": "random weights: near-uniform routing, the worst case for a cache",
              "bandwidth": pcie_bandwidths([0, 1])}
    folder = Path(args.folder or tempfile.mkdtemp(prefix="gpt-oss-", dir="/tmp"))
    if not (folder / "config.json").exists():
        started = time.perf_counter()
        write_tiny_gpt_oss(folder, scale_exponents=(116, 119), **REAL_SIZES[args.model], **SHAPES)
        report["checkpoint_write_s"] = time.perf_counter() - started
    facts = ModelFacts.from_folder(ModelFolder.open(folder))
    report["expert_bytes"], report["total_experts"], report["runs"] = facts.expert_bytes, facts.total_experts, []
    for fraction in (float(f) for f in args.fractions.split(",")):
        budget = expert_budget(facts, fraction, args.prompt + args.new)
        for budgets in ((budget,), (budget, budget)):
            run = {"budget_fraction_of_routed_experts_per_gpu": fraction,
                   **decode_run(folder, budgets, args.prompt, args.new, facts)}
            run["pcie_floor_s"] = pcie_floor_s(run, report["bandwidth"])
            run["ratio_to_pcie_floor"] = run["pcie_floor_s"] * run["decode_tok_s"]
            report["runs"].append(run)
            print(json.dumps({k: v for k, v in run.items() if not isinstance(v, dict)}), flush=True)
            Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"{'budget':>7} {'gpus':>4} {'slots':>6} {'tok/s':>8} {'hit':>6} {'MB/tok':>8} {'of floor':>9}")
    for run in report["runs"]:
        print(f"{run['budget_fraction_of_routed_experts_per_gpu']:>7.3f} {run['gpus']:>4} {run['expert_slots']:>6} "
              f"{run['decode_tok_s']:>8.1f} {run['decode_hit_rate'] or 0:>6.2f} "
              f"{run['decode_bytes_fetched_per_token'] / 1e6:>8.1f} {run['ratio_to_pcie_floor']:>9.2f}")


if __name__ == "__main__":
    main()
