"""How fast the C expert kernels (app/kernels/cpu/) compute one token's routed experts, by format, instruction set
and thread count: the CPU expert tier's cost per expert (app/engine/experts/cpu_tier.py) and the planner's CPU
rates. Formats: gpt-oss-20b's MXFP4 experts (gpt_oss_experts.c) and GLM-4.5-Air's FP8 ones with a scale per row
(glu_experts.c). The experts are random, in RAM, and each call reads experts the previous calls did not (as
decoding does), so the caches do not hold them.

    python bench/cpu_expert_rate.py OUT.json [--formats mxfp4,fp8] [--vectors avx2,avx512] [--threads 1,4,8,12,15,16]
        [--experts 96] [--calls 24]
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.kernels.cpu import library
from app.kernels.glu_experts import glu_experts_cpu
from app.kernels.gpt_oss_experts import gpt_oss_experts_cpu
from tests.fixtures.tiny_glm import GLM_4_5_AIR_FP8_CONFIG
from tests.kernels.test_gpt_oss_experts import random_arenas

GPT_OSS_WIDTH = GPT_OSS_HIDDEN = 2880  # gpt-oss-20b and -120b
LIMIT, ALPHA = 7.0, 1.702

Experts = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (x, slots, weights) -> out


def mxfp4_experts(count: int) -> tuple[Experts, int, int]:
    """gpt-oss's experts: the kernel on them, the hidden size, an expert's bytes."""
    arenas = random_arenas(count, True, torch.Generator().manual_seed(0), GPT_OSS_HIDDEN, GPT_OSS_WIDTH)
    expert_bytes = sum(t[0].numel() * t.element_size() for t in arenas.values())
    return (lambda x, slots, weights: gpt_oss_experts_cpu(x, arenas, slots, weights, LIMIT, ALPHA)), \
        GPT_OSS_HIDDEN, expert_bytes


def fp8_experts(count: int) -> tuple[Experts, int, int]:
    """GLM-4.5-Air's experts (random bytes: the time does not depend on the values, NaNs aside)."""
    hidden, width = GLM_4_5_AIR_FP8_CONFIG["hidden_size"], GLM_4_5_AIR_FP8_CONFIG["moe_intermediate_size"]
    generator = torch.Generator().manual_seed(0)
    arenas = {}
    for name, shape in (("gate_proj", (width, hidden)), ("up_proj", (width, hidden)), ("down_proj", (hidden, width))):
        codes = torch.randint(0, 0x7E, (count, *shape), generator=generator, dtype=torch.uint8)
        arenas[f"{name}.weight"] = codes.view(torch.float8_e4m3fn)
        arenas[f"{name}.weight_scale"] = torch.rand(count, shape[0], 1, generator=generator) * 1e-3
    expert_bytes = sum(t[0].numel() * t.element_size() for t in arenas.values())
    return (lambda x, slots, weights: glu_experts_cpu(x, arenas, slots, weights)), hidden, expert_bytes


FORMATS = {"mxfp4": mxfp4_experts, "fp8": fp8_experts}


def call_seconds(experts: Experts, hidden: int, count: int, picks: int, calls: int) -> float:
    """The median seconds of a call on one token picking `picks` experts, each call `picks` experts further on."""
    x, weights = torch.randn(1, hidden), torch.ones(1, picks)
    samples = []
    for call in range(calls + 2):
        slots = (torch.arange(picks) + call * picks) % count
        started = time.perf_counter()
        experts(x, slots[None], weights)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples[2:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--formats", default="mxfp4,fp8")
    parser.add_argument("--vectors", default=",".join(library.VECTORS[1:]), help="instruction sets to compare")
    parser.add_argument("--threads", default="1,4,8,12,15,16")
    parser.add_argument("--experts", type=int, default=96, help="experts in RAM (13.2 MB each for MXFP4)")
    parser.add_argument("--calls", type=int, default=24)
    args = parser.parse_args()
    if not library.built():
        raise SystemExit("the CPU kernels are not built: pip install -e . (or setup.py build_ext --inplace)")
    best, rows = library.vectors(), []
    for fmt in args.formats.split(","):
        experts, hidden, expert_bytes = FORMATS[fmt](args.experts)
        for vectors in args.vectors.split(","):
            if library.use_vectors(vectors) != vectors:
                print(f"{fmt}: this CPU has no {vectors}", flush=True)
                continue
            for threads in (int(n) for n in args.threads.split(",")):
                torch.set_num_threads(threads)
                one = call_seconds(experts, hidden, args.experts, 1, args.calls)
                four = call_seconds(experts, hidden, args.experts, 4, args.calls)
                per_expert = (four - one) / 3
                rows.append({"format": fmt, "vectors": vectors, "threads": threads, "expert_bytes": expert_bytes,
                             "one_expert_s": one, "four_experts_s": four, "per_expert_s": per_expert,
                             "call_s": max(one - per_expert, 0.0), "expert_GBps": expert_bytes / per_expert / 1e9})
                print(f"{fmt} {vectors:>6} {threads:>3} threads: 1 expert {one * 1e3:.3f} ms, 4 experts "
                      f"{four * 1e3:.3f} ms, {per_expert * 1e3:.3f} ms an expert ({rows[-1]['expert_GBps']:.1f} GB/s)",
                      flush=True)
        library.use_vectors(best)
    report = {"command": " ".join(sys.argv), "machine": {"cpu": platform.processor() or platform.machine(),
                                                           "cores": os.cpu_count(), "vectors": best},
              "what": __doc__.strip().splitlines()[0], "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
