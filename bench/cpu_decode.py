"""The bundled demo model decoding on the CPU, this engine against llama.cpp in the same run, turn by turn (load on a
shared machine drifts: each round times both, the medians over rounds are compared).

    python bench/cpu_decode.py [OUT.json] --llama-build BUILD_DIR [--peer PEER_DIR] [--gguf FILE]
        [--threads 1,2] [--rounds 5] [--new 128] [--prompts 4]

BUILD_DIR is where the peer's build_llamacpp.sh built llama.cpp for the CPU (BUILD_DIR/bin/llama-bench). The demo
is converted to GGUF once, by the peer's convert.sh (PEER_DIR; a dummy vocabulary: llama.cpp's converter does not
know the demo's tokenizer, and llama-bench feeds token ids, never text), into --gguf. Routing is the model's own in
both: this engine decodes greedy answers to held-out chats (resources/models/demo-gpt-oss/heldout.json), llama-bench
random token ids after a context of the same length (-d). Each engine runs at each thread count (torch's threads,
which the C expert kernels share; llama-bench -t).
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.generation.sampling import SamplingParams
from app.engine.session import Prompt, Session, collect
from app.kernels.cpu import library
from app.paths import DEMO_MODEL
from app.plan import plan_placement, predict_decode
from app.plan_cpu import CPU_HARDWARE
from bench.decode_gpt_oss import cpu_machine


def engine_round(session: Session, prompts: list[list[int]], new: int) -> float:
    """Decode tok/s over all prompts' answers together (greedy)."""
    tokens, seconds = 0, 0.0
    for ids in prompts:
        stats = collect(session.generate(ids, SamplingParams(), new))["stats"]
        tokens += stats["decode_tokens"]
        seconds += stats["decode_tokens"] / stats["decode_tok_s"]
    return tokens / seconds


def step_parts(session: Session, depth: int, steps: int = 200) -> dict:
    """Seconds per decode step after `depth` tokens of context, and of its parts: one layer's expert op (one token,
    the model's top-k picks of distinct experts), the final norm and logits; what is left per layer is the per-layer
    overhead the planner counts (app/ui/hardware.py CPU_HARDWARE)."""
    runner, model = session.runner, session.loaded.model
    config, cache = model.config, model.experts
    with torch.inference_mode():
        runner.begin()
        runner.prefill(list(range(3, 3 + depth)))
        step = median_seconds(lambda: runner.run([5]), steps)
        hidden = torch.randn(1, config.hidden_size)
        slots = cache.slot_table[0][torch.arange(config.num_experts_per_tok)][None]
        weights = torch.full((1, config.num_experts_per_tok), 1 / config.num_experts_per_tok)
        experts = median_seconds(lambda: model.run_experts(hidden, cache.arenas, slots, weights), steps)
        logits = median_seconds(lambda: model.finish(hidden, {}, (), last_only=True), steps)
    layers = config.num_hidden_layers
    return {"step_s": step, "expert_op_s": experts, "per_expert_s": experts / config.num_experts_per_tok,
            "norm_and_logits_s": logits, "per_layer_overhead_s": (step - logits - layers * experts) / layers}


def median_seconds(call, repeats: int) -> float:
    """The median of `repeats` timed calls, in groups of 10 (one call is too short to time alone)."""
    times = []
    for _ in range(repeats // 10):
        started = time.perf_counter()
        for _ in range(10):
            call()
        times.append((time.perf_counter() - started) / 10)
    return statistics.median(times)


def llama_round(command: list[str]) -> float:
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout)[0]["avg_ts"]


def llama_command(build: Path, gguf: Path, threads: int, new: int, depth: int) -> list[str]:
    return [str(build / "bin" / "llama-bench"), "-m", str(gguf), "-p", "0", "-n", str(new), "-d", str(depth),
            "-r", "1", "-t", str(threads), "-o", "json"]


def convert(peer: Path, build: Path, gguf: Path) -> str:
    command = ["bash", str(peer / "convert.sh"), str(build), str(DEMO_MODEL), str(gguf)]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # the converter needs torch
    subprocess.run(command, check=True, capture_output=True, env=env)
    return " ".join(command)


def summary(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", default=f"bench/results/cpu-decode-demo-{datetime.date.today()}.json")
    parser.add_argument("--llama-build", type=Path, required=True)
    parser.add_argument("--peer", type=Path, help="the folder of convert.sh, to convert the demo once")
    parser.add_argument("--gguf", type=Path, default=Path("/tmp/demo-gpt-oss.gguf"))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args()
    conversion = None
    if not args.gguf.exists():
        if args.peer is None:
            parser.error(f"{args.gguf} does not exist: give --peer to convert the demo")
        conversion = convert(args.peer, args.llama_build, args.gguf)
    heldout = json.loads((DEMO_MODEL / "heldout.json").read_text())[: args.prompts]
    session = Session.load(DEMO_MODEL, context=2048, dtype="float32", device="cpu")
    prompts = [session.prompt_ids(Prompt(messages=chat["messages"], reasoning_effort=chat["reasoning_effort"]))
               for chat in heldout]
    depth = round(statistics.median(len(ids) for ids in prompts))
    threads = [int(t) for t in args.threads.split(",")]
    engine = {n: [] for n in threads}
    llama = {n: [] for n in threads}
    parts = {n: [] for n in threads}
    load_before = os.getloadavg()
    started = time.monotonic()
    engine_round(session, prompts[:1], 16)  # warm-up
    for _ in range(args.rounds):
        for n in threads:
            torch.set_num_threads(n)
            engine[n].append(engine_round(session, prompts, args.new))
            parts[n].append(step_parts(session, depth))
            llama[n].append(llama_round(llama_command(args.llama_build, args.gguf, n, args.new, depth)))
            print(f"threads {n}: engine {engine[n][-1]:.1f} tok/s, llama.cpp {llama[n][-1]:.1f} tok/s", flush=True)
    by_threads = {n: {"engine_tok_s": summary(engine[n]), "llama_cpp_tok_s": summary(llama[n]),
                      "ratio": statistics.median(engine[n]) / statistics.median(llama[n]),
                      "engine_step_parts": {name: statistics.median(p[name] for p in parts[n]) for name in parts[n][0]}}
                  for n in threads}
    best_engine = max(threads, key=lambda n: statistics.median(engine[n]))
    best_llama = max(threads, key=lambda n: statistics.median(llama[n]))
    facts = session.loaded.facts
    predicted = predict_decode(facts, plan_placement(facts, None, None, 2048, 4), 4, CPU_HARDWARE).tok_s_low
    measured = statistics.median(engine[best_engine])
    report = {
        "machine": {**cpu_machine(), "torch_threads": threads, "cpu_model": _cpu_model(),
                    "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "commands": {
            "this": " ".join(["python", *sys.argv]),
            "engine": "Session.load(DEMO_MODEL, context=2048, dtype='float32', device='cpu'), greedy, "
                      f"max_new_tokens={args.new}, torch.set_num_threads(t)",
            "llama_cpp": " ".join(llama_command(args.llama_build, args.gguf, 0, args.new, depth)).replace(
                "-t 0", "-t {threads}"),
            "conversion": conversion or f"{args.gguf} (converted before)",
        },
        "model": {"target": str(DEMO_MODEL), "gguf": str(args.gguf), "dtype": "float32 (llama.cpp: the GGUF's "
                  "types, MXFP4 experts)", "expert_kernel": "C" if library.library() else "torch reference"},
        "routing": "the model's own: greedy answers to held-out chats here, random token ids in llama-bench",
        "prompts": len(prompts), "context_tokens": depth, "rounds": args.rounds, "max_new_tokens": args.new,
        "seconds": round(time.monotonic() - started, 1),
        "by_threads": by_threads,
        "best": {"engine_threads": best_engine, "llama_cpp_threads": best_llama,
                 "ratio": measured / statistics.median(llama[best_llama])},
        "planner": {"hardware": "app/ui/hardware.py CPU_HARDWARE", "predicted_tok_s": predicted,
                    "measured_tok_s": measured, "error": predicted / measured - 1},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report["best"]))


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
