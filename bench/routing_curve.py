"""The expert cache's hit rate against the share of experts it holds, on the real gpt-oss-20b routing
(bench/data/gpt-oss-20b-routing.npz), under the engine's policy as decode runs it: misses read in place and
admitted into the host's queue of victims, settled once a token (app/engine/experts/device_misses.py; the device's
residency kernel replaced by its reference, so this runs on a CPU), and under plain LRU for comparison. The
planner's routing curve for gpt_oss models (app/plan.py) comes from this file.

    python bench/routing_curve.py [--tokens 6000] [--shares 0.05,0.1,0.25,0.5,0.75]

Writes bench/results/routing-curve-gpt-oss-20b-<date>.json.
"""

import argparse
import json
import sys
from datetime import date
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.experts import device_misses
from app.kernels.expert_resolve import resolve_experts_torch
from bench.decode_gpt_oss import TRACE, cpu_machine
from tools.demo.routing import bookkeeping_cache

LAYERS, EXPERTS, TOP_K = 24, 32, 4


def engine_hit_rate(trace: np.ndarray, slots: int) -> float:
    """Every token's picks through the in-place residency, a settle after each token (as the runner does)."""
    device_misses.resolve_experts = resolve_experts_torch  # the residency kernel's host reference
    cache = bookkeeping_cache(LAYERS, EXPERTS, slots)
    cache.serve_misses_on_device(TOP_K)
    state = cache.device_misses
    for token in trace:
        for layer in range(LAYERS):
            resolve_experts_torch(torch.from_numpy(token[layer].astype(np.int64)), layer, layer == 0,
                                  state.residency, state.reads, state.sources)
        cache.settle()
    return cache.stats.hit_rate


def lru_hit_rate(trace: np.ndarray, slots: int) -> float:
    cache = bookkeeping_cache(LAYERS, EXPERTS, slots, lru=True)
    for token in trace:
        for layer in range(LAYERS):
            cache.ensure(layer, sorted(token[layer].tolist()))
    return cache.stats.hit_rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=6000, help="the first tokens of the trace")
    parser.add_argument("--shares", default="0.05,0.1,0.25,0.5,0.75")
    args = parser.parse_args()
    trace = np.load(TRACE)["experts"][: args.tokens]
    points = []
    for share in (float(s) for s in args.shares.split(",")):
        slots = round(share * LAYERS * EXPERTS)
        point = {"share": share, "slots": slots, "engine": round(engine_hit_rate(trace, slots), 4),
                 "lru": round(lru_hit_rate(trace, slots), 4)}
        points.append(point)
        print(json.dumps(point), flush=True)
    report = {"command": " ".join(sys.argv), "machine": cpu_machine(), "trace": "bench/data/" + TRACE.name,
              "tokens": len(trace), "policy": "misses served on the device, admitted from the settled victim queue",
              "points": points}
    out = Path(__file__).parent / "results" / f"routing-curve-gpt-oss-20b-{date.today()}.json"
    out.write_text(json.dumps(report, indent=2))
    print(out)


if __name__ == "__main__":
    main()
