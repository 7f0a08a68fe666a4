"""Where a fully resident decode step's time goes: the kernels of one token, by name, of synthetic GLM-4.5-Air-FP8
(`glm`), GLM-4.7-Flash (MLA attention, bf16) or gpt-oss-20b.

    python bench/profile_decode_step.py OUT.json [--model glm|glm-4.7-flash|gpt-oss-20b] [--layers 4] [--prompt 512]
        [--steps 20] [--tokens 1]

Fully resident, the decode step is one CUDA graph (cuda_graph.DecodeGraph) and runs well below the HBM floor
(bench/NOTES.md): this says which kernels fill it. The checkpoint is bench/decode_glm.py's or
bench/decode_gpt_oss.py's (published shapes, random dense weights) with --layers layers, which scales every
per-layer figure alike. Written: the graph step's wall time per token; per kernel name the GPU time per token
summed over the eager step's launches (torch.profiler; the same kernels the graph replays), longest first; and
the launches per layer: the eager step's launches less those of a step over the first half of the layers, per
layer of the other half. With --tokens T > 1 the pass is a speculative verify of T positions, and every figure is
per pass, not per token.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.loader import load_model
from app.engine.runner.cuda_graph import DecodeGraph
from app.engine.runner.step_runner import prefill
from app.model_folder import ModelFolder
from bench.decode_glm import PUBLISHED
from bench.decode_gpt_oss import SHAPES, machine
from tests.fixtures.tiny_glm import write_real_size_glm
from tests.fixtures.tiny_gpt_oss import write_tiny_gpt_oss


def write_checkpoint(folder: Path, model: str, layers: int) -> str:
    """The synthetic checkpoint of `model` with `layers` layers (kept where one is already); returns its
    description."""
    glm = PUBLISHED.get("glm-4.5-air-fp8" if model == "glm" else model)
    if glm is not None and not (folder / "config.json").exists():
        write_real_size_glm(folder, {**glm[1], "num_hidden_layers": layers})
    elif not (folder / "config.json").exists():
        write_tiny_gpt_oss(folder, scale_exponents=(116, 119), num_hidden_layers=layers, num_local_experts=32,
                           **SHAPES)
    return f"synthetic {model if glm is None else glm[0]}, {layers} layers"


def eager_kernels(model, cache, steps: int, tokens: int = 1) -> list[tuple[str, float, float]]:
    """(kernel name, GPU µs per pass, launches per pass) of eager passes over `tokens` positions, longest first."""
    def eager_step(token: int) -> None:
        model.forward(torch.arange(token, token + tokens, device=model.device), cache)
        cache.truncate(cache.length - tokens)  # every step at the same position

    return kernel_table(eager_step, steps)


def kernel_table(run, steps: int) -> list[tuple[str, float, float]]:
    """(kernel name, GPU µs per call, launches per call) of `run(0 … steps - 1)` after one warm-up call, longest
    first."""
    run(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        for step in range(steps):
            run(step)
        torch.cuda.synchronize()
    kernels = [event for event in trace.key_averages() if event.device_time_total > 0]
    return sorted(((event.key, event.device_time_total / steps, event.count / steps) for event in kernels),
                  key=lambda row: -row[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--model", choices=("glm", "glm-4.7-flash", "gpt-oss-20b"), default="glm")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--folder", help="where the checkpoint is (written there first if it is not)")
    parser.add_argument("--tokens", type=int, default=1, help="positions a pass commits (a verify's block)")
    args = parser.parse_args()
    folder = Path(args.folder or tempfile.mkdtemp(prefix=f"{args.model}-", dir="/tmp"))
    description = write_checkpoint(folder, args.model, args.layers)
    context = args.prompt + (2 * args.steps + 8) * args.tokens
    loaded = load_model(ModelFolder.open(folder), device="cuda", dtype="bfloat16", context=context)
    model = loaded.model
    cache = model.new_kv_cache(context)
    prefill(model, cache, list(range(100, 100 + args.prompt)))
    graph = DecodeGraph(model, cache, num_tokens=args.tokens)
    for token in range(3):
        graph.run(list(range(token, token + args.tokens)))
    torch.cuda.synchronize()
    started = time.perf_counter()
    for token in range(args.steps):
        graph.run(list(range(token, token + args.tokens)))
    torch.cuda.synchronize()
    graph_s = (time.perf_counter() - started) / args.steps

    per_token = eager_kernels(model, cache, args.steps, args.tokens)
    launches = sum(n for _, _, n in per_token)
    all_layers, half = model.layers, args.layers // 2
    model.layers = all_layers[:half]
    launches_of_half = sum(n for _, _, n in eager_kernels(model, cache, args.steps, args.tokens))
    model.layers = all_layers
    total_us = sum(us for _, us, _ in per_token)
    report = {
        "command": " ".join(sys.argv), "machine": machine(), "model": description,
        "prompt": args.prompt, "tokens_per_pass": args.tokens, "dense_fp8_kept": loaded.facts.fp8_kept,
        "graph_step_us": graph_s * 1e6, "graph_step_us_per_layer": graph_s * 1e6 / args.layers,
        "eager_kernel_us_per_token": total_us, "eager_launches_per_token": launches,
        "launches_per_layer": (launches - launches_of_half) / (args.layers - half),
        "kernels": [{"name": name[:160], "us_per_token": us, "launches_per_token": n} for name, us, n in per_token],
    }
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"graph step {graph_s * 1e6:.0f} us ({graph_s * 1e6 / args.layers:.0f} per layer); "
          f"eager kernels {total_us:.0f} us in {launches:.0f} launches per token, "
          f"{report['launches_per_layer']:.1f} per layer")
    for name, us, n in per_token[:25]:
        print(f"{us:9.1f} us {n:6.1f}x  {name[:110]}")


if __name__ == "__main__":
    main()
