"""Batch-1 decode of a synthetic gpt-oss checkpoint (real shapes and formats, random weights) at GPU
budgets that hold 100 %, 50 % and 25 % of the routed experts, against the floors measured in the
same run (pinned PCIe copy, HBM copy), llama.cpp run in the same session (`--llama-json`, llama-bench's
JSON output on the same checkpoint) and, optionally, the transformers + accelerate offload peer.

    python bench/decode_gpt_oss.py OUT.json [--model 20b|120b] [--prompt 512] [--new 256] [--repeats 3]
        [--routing model,trace,uniform] [--misses device,host] [--cpu-threads 0,14] [--llama-json FILE] [--peer]

Routing decides what an expert cache does (performance.md's protocol): `model` is the synthetic model's own
(random weights), `trace` replays the real gpt-oss-20b's routing (bench/data/), `uniform` draws every token's
experts uniformly at random (the worst case); under both overrides the router's scores weight the chosen
experts and look-ahead predictions still come from the router (app/engine/experts/routing_override.py). `--misses`:
the device serves misses with no host work (`device`, the engine's default: app/engine/experts/device_misses.py), or
the host copies them first (`host`: it waits at each layer). `--cpu-threads`: with misses served on the device, the
host's cores (that many threads; 0: none) compute part of them (app/engine/experts/cpu_tier.py). For 120b the
experts are zeros in a sparse file (61 GB of random bytes do not fit the GPU machine's disk); its routing is the
model's own or uniform (the trace is 20b's).
"""

import argparse
import gc
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.experts.routing_override import ReplayedRouting, UniformRouting
from app.engine.generation.generate import generate
from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.loader import load_model
from app.engine.runner.step_runner import StepRunner
from app.model_folder import ModelFolder
from app.plan import ModelFacts, dtype_bytes, plan_placement
from app.protocol.events import Done
from tests.fixtures.tiny_gpt_oss import write_tiny_gpt_oss

TRACE = Path(__file__).parent / "data" / "gpt-oss-20b-routing.npz"
ROUTINGS = {
    "model": "the synthetic model's own (random weights)",
    "trace": "the real gpt-oss-20b's routing replayed (bench/data/gpt-oss-20b-routing.npz), router-weighted",
    "uniform": "every token's experts drawn uniformly at random on the device, router-weighted",
}

REAL_SIZES = {
    "20b": {"num_hidden_layers": 24, "num_local_experts": 32},
    "120b": {"num_hidden_layers": 36, "num_local_experts": 128},
}
SHAPES = {
    "hidden_size": 2880, "intermediate_size": 2880, "head_dim": 64, "num_attention_heads": 64,
    "num_key_value_heads": 8, "num_experts_per_tok": 4, "experts_per_token": 4, "sliding_window": 128,
    "vocab_size": 201088, "eos_token_id": 200002, "pad_token_id": 199999,
}


def machine() -> dict:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    import triton

    return {"gpu": smi, "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "cpu_count": os.cpu_count()}


def cpu_machine() -> dict:
    return {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
            "python": platform.python_version(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}


def copy_bandwidths(on: str = "cuda") -> dict:
    """Pinned host -> device copies in expert-sized chunks, and a device copy. On a CPU (a pipeline check) both
    are RAM copies, of a smaller size."""
    cuda = on == "cuda"
    chunk = 13_240_000 if cuda else 1_324_000
    host = torch.empty(64 * chunk, dtype=torch.uint8, pin_memory=cuda)
    device = torch.empty_like(host, device=on)
    big = torch.empty(4 << 30 if cuda else 64 << 20, dtype=torch.uint8, device=on)
    big_out = torch.empty_like(big)

    def chunked_copy():
        for i in range(64):
            device[i * chunk : (i + 1) * chunk].copy_(host[i * chunk : (i + 1) * chunk], non_blocking=True)

    pcie = host.numel() / median_seconds(chunked_copy, cuda)
    hbm = 2 * big.numel() / median_seconds(lambda: big_out.copy_(big), cuda)  # read + write
    return {"pcie_pinned_13MB_chunks_Bps": pcie, "hbm_copy_read_plus_write_Bps": hbm}


def median_seconds(fn, cuda: bool = True, repeats: int = 5) -> float:
    """The median time of `fn` after a warm-up: device events on a GPU, the host's clock otherwise."""
    fn()
    if not cuda:
        return statistics.median(_seconds(fn) for _ in range(repeats))
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def _seconds(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def expert_budget(facts: ModelFacts, budget_fraction: float, context: int, dtype_bytes: int = 2) -> int:
    """The GPU budget that leaves room for that fraction of the routed experts besides everything else."""
    fixed = plan_placement(facts, None, None, context, dtype_bytes)
    return (fixed.resident_bytes + fixed.kv_cache_bytes + fixed.workspace_bytes
            + int(budget_fraction * facts.total_experts) * facts.expert_bytes)


def compute_dtype(device: str) -> str:
    return "bfloat16" if device == "cuda" else "float32"  # a CPU runs the pipeline check as the CPU tests do


def routing_override(name: str, facts: ModelFacts, device: torch.device):
    """The override a run's routing names (None: the model's own)."""
    if name == "model":
        return None
    if name == "uniform":
        torch.manual_seed(0)
        return UniformRouting(facts.num_experts, facts.top_k, device)
    trace = np.load(TRACE)["experts"]
    if trace.shape[1:] != (len(facts.moe_layers), facts.top_k) or trace.max() >= facts.num_experts:
        raise SystemExit(f"the trace is gpt-oss-20b's routing {trace.shape[1:]}: it does not fit this model")
    return ReplayedRouting(trace, facts.moe_layers, device)


def decode_runs(folder: Path, budget_fraction: float, prompt: int, new: int, facts: ModelFacts,
                prefetch_layers: int = 0, ram_budget: int | None = None, device: str = "cuda",
                repeats: int = 3, routings: tuple[str, ...] = ("model",), misses: str = "device",
                cpu_threads: int = 0, steps: tuple[str, ...] = ("ahead",)) -> list[dict]:
    """Load under the budget once; per routing, decode `repeats` times (the first warms up) over one runner, as
    a session does (the next routing's runner captures its own passes), for each way of stepping in `steps`
    (`ahead`: passes run one ahead of the host where the cache allows it, `in-turn`: each waits for its token);
    on a CPU (a pipeline check) in float32 and with no device memory figures."""
    cuda = device == "cuda"
    dtype = compute_dtype(device)
    budget = expert_budget(facts, budget_fraction, prompt + new, dtype_bytes(dtype))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    started = time.perf_counter()
    loaded = load_model(ModelFolder.open(folder), device=device, dtype=dtype, context=prompt + new,
                        gpu_budget=budget, ram_budget=ram_budget, prefetch_layers=prefetch_layers,
                        misses_on_device=misses == "device", cpu_threads=cpu_threads)
    load_s = time.perf_counter() - started
    model, placement = loaded.model, loaded.placement
    on_device = getattr(model.experts, "device_misses", None) is not None
    tier = model.experts.device_misses.cpu_tier if on_device else None
    ids = torch.randint(0, facts.vocab_size, (prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    results = []
    for routing, stepping in itertools.product(routings, steps):
        model.routing_override = routing_override(routing, facts, model.device)
        runner = StepRunner(model, prompt + new, run_ahead=stepping == "ahead")
        runs = [_timed_generation(runner, ids, new) for _ in range(repeats)]
        ran_ahead = runner.runs_ahead
        peak = torch.cuda.max_memory_allocated() - base if cuda else None  # since the load: every routing so far
        del runner
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        run = sorted(runs[1:], key=lambda r: r["decode_tok_s"])[0]  # the slowest warm run
        results.append({
            "budget_fraction_of_routed_experts": budget_fraction,
            "routing": routing,
            "steps": "ahead" if ran_ahead else "in-turn",
            "misses": "none: all resident" if model.experts.complete else "device" if on_device else "host",
            "cpu_threads": tier.threads if tier else 0,
            "cpu_tier_costs_s": {"fetch": tier.fetch_s, "call": tier.call_s, "pair": tier.pair_s} if tier else None,
            "gpu_budget_bytes": budget,
            "expert_slots": placement.expert_slots,
            "host_experts": placement.host_experts,
            "load_s": load_s,
            "decode_tok_s_runs": [r["decode_tok_s"] for r in runs],
            **run,
            "max_memory_allocated_bytes": peak,
            "within_budget": peak <= budget if cuda else None,
        })
    if tier:
        tier.close()
    del model, loaded, tier
    gc.collect()  # the pinned experts go now, not at some later collection: the next budget pins its own
    if cuda:
        torch.cuda.empty_cache()
    return results


def _timed_generation(runner: StepRunner, ids: list[int], new: int) -> dict:
    """Decode speed and cache statistics counted from the end of the prefill."""
    model = runner.model
    events = generate(runner, ids, Sampler(SamplingParams(), model.device), new, [])
    next(events)  # the prefill is done and the first token is out
    before = model.experts.snapshot()
    done = next(event for event in events if isinstance(event, Done))
    delta = model.experts.snapshot().since(before).as_dict()
    tokens = done.stats.decode_tokens
    uses = delta["hits"] + delta["misses"]
    return {
        "decode_tok_s": done.stats.decode_tok_s,
        "ttft_s": done.stats.ttft_s,
        "decode_misses_per_token": delta["misses"] / tokens,
        "decode_cpu_computed_per_token": delta["cpu_computed"] / tokens,
        "decode_bytes_fetched_per_token": delta["bytes_fetched"] / tokens,
        "decode_hit_rate": delta["hits"] / uses if uses else None,
        "prefetch_coverage": delta["prefetch_coverage"],
        "prefetch_waste": delta["prefetch_waste"],
        "decode_expert_cache": delta,
    }


def floors(facts: ModelFacts, bandwidth: dict, run: dict, dtype_bytes: int = 2) -> dict:
    """Per-token floors: the bytes a fully resident step reads over HBM (the resident weights as the engine
    holds them, `ModelFacts.resident_bytes`: dense FP8 ones as stored on a GPU, but one embedding row; top-k
    routed experts per MoE layer in their checkpoint format), plus the missed bytes over PCIe."""
    embedding = facts.vocab_size * facts.hidden_size
    dense_read = facts.resident_bytes(dtype_bytes) - embedding * dtype_bytes
    expert_read = facts.expert_bytes_per_token
    hbm = bandwidth["hbm_copy_read_plus_write_Bps"]  # bytes moved per second by a copy (reads + writes)
    hbm_s = (dense_read + expert_read) / hbm
    pcie_s = run["decode_bytes_fetched_per_token"] / bandwidth["pcie_pinned_13MB_chunks_Bps"]
    ours_s = 1 / run["decode_tok_s"]
    return {
        "bytes_read_per_token": dense_read + expert_read,
        "hbm_floor_s": hbm_s,
        "pcie_floor_s": pcie_s,
        "floor_optimistic_s": max(hbm_s, pcie_s),
        "floor_pessimistic_s": hbm_s + pcie_s,
        "ratio_to_floor_optimistic": max(hbm_s, pcie_s) / ours_s,
        "ratio_to_floor_pessimistic": (hbm_s + pcie_s) / ours_s,
    }


def peer(folder: Path, budget: int, prompt: int, new: int, limit_s: float) -> dict:
    """transformers + accelerate, device_map offload under the same GPU budget (a short decode)."""
    from transformers import AutoModelForCausalLM

    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.bfloat16, device_map="auto",
        max_memory={0: budget, "cpu": 200 << 30},
    )
    load_s = time.perf_counter() - started
    ids = torch.randint(0, 1000, (1, prompt)).to("cuda")
    with torch.no_grad():
        out = model(ids, use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        started, tokens = time.perf_counter(), 0
        while tokens < new and time.perf_counter() - started < limit_s:
            out = model(token, past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            tokens += 1
        torch.cuda.synchronize()
    return {"load_s": load_s, "decode_tokens": tokens, "decode_tok_s": tokens / (time.perf_counter() - started)}


def write_synthetic(folder: Path, model: str) -> None:
    """The synthetic checkpoint of gpt-oss-`model` (also what llama.cpp converts in the same session)."""
    # 120b's 61 GB of experts do not fit the GPU machine's 64 GB disk as random bytes: zeros in a sparse
    # file instead (copy and kernel times do not depend on the values)
    write_tiny_gpt_oss(folder, scale_exponents=(116, 119), hollow_experts=model == "120b", **REAL_SIZES[model],
                       **SHAPES)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--model", choices=sorted(REAL_SIZES), default="20b")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--fractions", default="1.0,0.5,0.25")
    parser.add_argument("--prefetch", default="0", help="look-ahead depths to compare, e.g. 0,2")
    parser.add_argument("--repeats", type=int, default=3, help="decodes per budget; the first warms up")
    add_protocol_options(parser, default_routing="model,trace,uniform")
    parser.add_argument("--peer", action="store_true")
    parser.add_argument("--folder", help="reuse a synthetic checkpoint written earlier")
    args = parser.parse_args()

    report = {"command": " ".join(sys.argv), "machine": machine(), "model": f"synthetic gpt-oss-{args.model}"}
    if args.llama_json:
        report["peer_llama_cpp"] = llama_cpp_figures(Path(args.llama_json))
    report["bandwidth"] = copy_bandwidths()
    torch.cuda.empty_cache()
    folder = Path(args.folder or tempfile.mkdtemp(prefix="gpt-oss-", dir="/tmp"))
    if not (folder / "config.json").exists():
        started = time.perf_counter()
        write_synthetic(folder, args.model)
        report["checkpoint_write_s"] = time.perf_counter() - started
    facts = ModelFacts.from_folder(ModelFolder.open(folder))
    report["expert_bytes"], report["moe_layers"] = facts.expert_bytes, len(facts.moe_layers)
    budget_runs(report, folder, facts, args)
    if args.peer:
        budget = report["runs"][-1]["gpu_budget_bytes"]
        try:
            report["peer_transformers_offload"] = peer(folder, budget, args.prompt, 16, limit_s=60)
        except Exception as error:  # the peer is best effort: record why it did not run
            report["peer_transformers_offload"] = {"error": f"{type(error).__name__}: {error}"[:500]}
    Path(args.out).write_text(json.dumps(report, indent=2))
    print_table(report)
    print(json.dumps(report.get("peer_transformers_offload")))


def budget_runs(report: dict, folder: Path, facts: ModelFacts, args, device: str = "cuda",
                ram_budget: Callable[[float], int | None] = lambda fraction: None) -> None:
    """Decode runs (`args.repeats` decodes each) per budget in `args.fractions`, way of serving misses in
    `args.misses`, look-ahead depth in `args.prefetch` and routing in `args.routing`, each with its floors,
    appended to report["runs"]; the report is written to `args.out` after every budget."""
    report["runs"] = []
    report["routings"] = {name: ROUTINGS[name] for name in args.routing.split(",")}
    depths, ways, threads = args.prefetch.split(","), args.misses.split(","), args.cpu_threads.split(",")
    settings = [(float(f), int(d), m, int(n)) for f in args.fractions.split(",") for m in ways for d in depths
                for n in (threads if m == "device" else threads[:1])
                if float(f) < 1 or (d == depths[0] and m == ways[0] and n == threads[0])]  # all fit: no misses
    for fraction, depth, misses, cpu_threads in settings:
        for run in decode_runs(folder, fraction, args.prompt, args.new, facts, depth, ram_budget(fraction), device,
                               args.repeats, tuple(args.routing.split(",")), misses, cpu_threads,
                               tuple(args.steps.split(","))):
            run = {"prefetch_layers": depth, **run}
            run.update(floors(facts, report["bandwidth"], run, dtype_bytes(compute_dtype(device))))
            report["runs"].append(run)
            print(json.dumps({k: v for k, v in run.items() if not isinstance(v, dict)}), flush=True)
        add_peer_ratios(report)
        Path(args.out).write_text(json.dumps(report, indent=2))


def add_peer_ratios(report: dict) -> None:
    """Each run's tok/s over llama.cpp's decode at the same share of the experts on the GPU, where the report
    holds llama.cpp's figures (`peer_llama_cpp`: its `-ncmoe N` keeps N of the L layers' experts on the CPU)."""
    peer = report.get("peer_llama_cpp", {}).get("decode_tok_s_by_ncmoe")
    if not peer:
        return
    layers = report["moe_layers"]
    for run in report["runs"]:
        # our smallest share, 10 %, is compared with llama.cpp's every expert on the CPU (performance.md)
        share = run["budget_fraction_of_routed_experts"]
        ncmoe = layers if share <= 0.1 else round((1 - share) * layers)
        if str(ncmoe) in peer:
            run["llama_cpp_ncmoe"] = ncmoe
            run["ratio_to_llama_cpp"] = run["decode_tok_s"] / peer[str(ncmoe)]


def llama_cpp_figures(path: Path) -> dict:
    """llama-bench's JSON output (`-o json`) as tok/s by `-ncmoe`, decode (`-n`) and prefill (`-p`) apart; or a
    bench/results/llama-cpp-*.json file that holds them."""
    rows = json.loads(path.read_text())
    if isinstance(rows, dict):
        return {**rows, "file": str(path)}
    decode = {str(r["n_cpu_moe"]): r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0}
    prefill = {str(r["n_cpu_moe"]): r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0}
    return {"decode_tok_s_by_ncmoe": decode, "prefill_tok_s_by_ncmoe": prefill, "raw": rows}


def add_protocol_options(parser: argparse.ArgumentParser, default_routing: str) -> None:
    """The options every offloaded-decode benchmark shares (performance.md's protocol)."""
    parser.add_argument("--routing", default=default_routing, help=f"comma-separated: {', '.join(ROUTINGS)}")
    parser.add_argument("--misses", default="device", help="comma-separated: device, host")
    parser.add_argument("--cpu-threads", default="0", help="comma-separated CPU tier threads (0: no CPU tier)")
    parser.add_argument("--llama-json", help="llama-bench -o json output on the same checkpoint, this session")
    parser.add_argument("--steps", default="ahead", help="comma-separated: ahead (passes run one ahead of the host "
                        "where every expert is resident), in-turn (each step waits for its token)")


def print_table(report: dict) -> None:
    print(f"{'budget':>7} {'routing':>8} {'steps':>8} {'misses':>13} {'ahead':>5} {'cpu':>4} {'tok/s':>8} {'hit':>6} "
          f"{'cpu/tok':>7} {'MB/tok':>8} {'floor opt':>10} {'floor pes':>10} {'/llama':>7}")
    for run in report["runs"]:
        print(f"{run['budget_fraction_of_routed_experts']:>7.2f} {run['routing']:>8} {run['steps'][:8]:>8} "
              f"{run['misses'][:13]:>13} "
              f"{run['prefetch_layers']:>5} {run.get('cpu_threads', 0):>4} {run['decode_tok_s']:>8.1f} "
              f"{run['decode_hit_rate'] or 0:>6.2f} {run.get('decode_cpu_computed_per_token', 0):>7.1f} "
              f"{run['decode_bytes_fetched_per_token'] / 1e6:>8.1f} "
              f"{run['ratio_to_floor_optimistic']:>10.2f} {run['ratio_to_floor_pessimistic']:>10.2f} "
              f"{run.get('ratio_to_llama_cpp', float('nan')):>7.2f}")


if __name__ == "__main__":
    main()
