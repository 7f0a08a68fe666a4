"""How fast the C expert kernel (app/kernels/cpu/gpt_oss_experts.c) computes gpt-oss-20b's MXFP4 experts for one
token, by thread count: the CPU expert tier's cost per expert (app/engine/experts/cpu_tier.py) and the planner's CPU
rates. The experts are random, in RAM, and each call reads experts the previous calls did not (as decoding does),
so the caches do not hold them.

    python bench/cpu_expert_rate.py OUT.json [--threads 1,4,8,12,15,16] [--experts 96] [--calls 24]
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.kernels.cpu import library
from app.kernels.gpt_oss_experts import gpt_oss_experts_cpu
from tests.kernels.test_gpt_oss_experts import random_arenas

WIDTH = HIDDEN = 2880  # gpt-oss-20b and -120b
LIMIT, ALPHA = 7.0, 1.702


def call_seconds(arenas: dict[str, torch.Tensor], picks: int, calls: int) -> float:
    """The median seconds of a call on one token picking `picks` experts, each call `picks` experts further on."""
    count = arenas["down_proj_bias"].shape[0]
    x, weights = torch.randn(1, HIDDEN), torch.ones(1, picks)
    samples = []
    for call in range(calls + 2):
        slots = (torch.arange(picks) + call * picks) % count
        started = time.perf_counter()
        gpt_oss_experts_cpu(x, arenas, slots[None], weights, LIMIT, ALPHA)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples[2:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--threads", default="1,4,8,12,15,16")
    parser.add_argument("--experts", type=int, default=96, help="experts in RAM (13.2 MB each)")
    parser.add_argument("--calls", type=int, default=24)
    args = parser.parse_args()
    if not library.built():
        raise SystemExit("the CPU kernels are not built: pip install -e . (or setup.py build_ext --inplace)")
    arenas = random_arenas(args.experts, True, torch.Generator().manual_seed(0), HIDDEN, WIDTH)
    expert_bytes = sum(t[0].numel() * t.element_size() for t in arenas.values())
    rows = []
    for threads in (int(n) for n in args.threads.split(",")):
        torch.set_num_threads(threads)
        one, four = call_seconds(arenas, 1, args.calls), call_seconds(arenas, 4, args.calls)
        per_expert = (four - one) / 3
        rows.append({"threads": threads, "one_expert_s": one, "four_experts_s": four, "per_expert_s": per_expert,
                     "call_s": max(one - per_expert, 0.0), "expert_GBps": expert_bytes / per_expert / 1e9,
                     "weights_per_s": 3 * WIDTH * HIDDEN / per_expert})
        print(f"{threads:>3} threads: 1 expert {one * 1e3:.3f} ms, 4 experts {four * 1e3:.3f} ms, "
              f"{per_expert * 1e3:.3f} ms an expert ({rows[-1]['expert_GBps']:.1f} GB/s)", flush=True)
    report = {"command": " ".join(sys.argv), "machine": {"cpu": platform.processor() or platform.machine(),
                                                           "cores": os.cpu_count(), "avx2": library.has_avx2()},
              "expert_bytes": expert_bytes, "what": __doc__.strip().splitlines()[0], "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
