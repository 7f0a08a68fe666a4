"""Host cost of the expert cache's eviction policy: time per `ExpertCache.ensure` call (one layer of one
decode token) at the shape of gpt-oss-120b (36 MoE layers × 128 experts, top-4), under the engine's policy
(app/engine/experts/cache_policy.py) and under LRU (the same heap with a half-life of one use).

    python bench/expert_eviction.py [--tokens 3000]

Experts are one byte on the CPU, so the time is the cache's bookkeeping (policy, slot table), not copies.
Routing is synthetic: Zipf-skewed popularity per layer, half of a token's experts reused from the previous
token. Writes bench/results/expert-eviction-cpu-<date>.json with the hit rates it saw too.
"""

import argparse
import json
import os
import sys
import time
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.decode_gpt_oss import cpu_machine  # noqa: E402
from tools.demo.routing import bookkeeping_cache  # noqa: E402

LAYERS, EXPERTS, TOP_K = 36, 128, 4


def synthetic_routing(tokens: int, seed: int = 0) -> list[list[list[int]]]:
    """Per token, per layer: TOP_K sorted distinct experts."""
    generator = torch.Generator().manual_seed(seed)
    popularity = 1.0 / torch.arange(1, EXPERTS + 1, dtype=torch.float64) ** 0.8
    orders = [torch.randperm(EXPERTS, generator=generator) for _ in range(LAYERS)]
    previous = [[] for _ in range(LAYERS)]
    routing = []
    for _ in range(tokens):
        token = []
        for layer in range(LAYERS):
            kept = [e for e in previous[layer] if torch.rand(1, generator=generator) < 0.5]
            fresh = orders[layer][torch.multinomial(popularity, TOP_K, generator=generator)].tolist()
            picks = list(dict.fromkeys(kept + fresh))[:TOP_K]
            previous[layer] = picks
            token.append(sorted(picks))
        routing.append(token)
    return routing


def timed(routing, slots: int, lru: bool) -> dict:
    cache = bookkeeping_cache(LAYERS, EXPERTS, slots, lru)
    started = time.perf_counter()
    for token in routing:
        for layer, experts in enumerate(token):
            cache.ensure(layer, experts)
    seconds = time.perf_counter() - started
    calls = len(routing) * LAYERS
    return {"slots": slots, "policy": "lru" if lru else "engine", "us_per_ensure": round(seconds / calls * 1e6, 2),
            "ms_per_token": round(seconds / len(routing) * 1e3, 3),
            "hit_rate": round(cache.stats.hit_rate, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3000)
    args = parser.parse_args()
    routing = synthetic_routing(args.tokens)
    runs = []
    for share in (0.25, 0.5):
        for lru in (True, False):
            runs.append(timed(routing, int(share * LAYERS * EXPERTS), lru))
            print(runs[-1], flush=True)
    report = {
        "name": "expert-eviction",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": cpu_machine() | {"load_average": os.getloadavg()},
        "shape": {"layers": LAYERS, "experts": EXPERTS, "top_k": TOP_K, "tokens": args.tokens},
        "floor": "LRU in the same cache (the runs with policy 'lru'): the engine's policy should cost about the same",
        "runs": runs,
    }
    out = ROOT / "bench" / "results" / f"expert-eviction-cpu-{date.today().isoformat()}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
