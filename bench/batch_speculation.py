"""Speculative requests decoded together against the same requests one after another: the bundled demo model
and its DFlash drafter, greedy, through the engine process's batch (app/engine/generation/batch.py), with the
experts in a few cache slots so that the expert sweep a step shares is worth sharing.

    python bench/batch_speculation.py OUT.json [--requests 4] [--new 64] [--slots 24] [--block-size 8]
        [--device cpu|cuda] [--repeats 3]

Each run decodes the first --requests held-out chats of the demo (resources/models/demo-gpt-oss/heldout.json):
together in one batch of --requests sequences, or in a batch of one after another. Reports wall time, tok/s,
τ (emitted tokens per step after the first) and expert bytes copied per token, the median of --repeats runs of
each, and checks that both give the same tokens (greedy). The floor is one after another on the same machine.
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

from app.engine.generation.batch import Batch
from app.engine.generation.sampling import SamplingParams
from app.engine.models.dflash import open_dflash
from app.engine.session import Prompt, Session
from app.engine.spec.options import SpecOptions
from app.paths import DEMO_DRAFTER, DEMO_MODEL
from app.protocol.events import Done, Tokens
from tests.test_cli_spec import budget_for_slots


def decode(session: Session, prompts: list[list[int]], new: int, together: bool) -> dict:
    """Greedy answers of `prompts`, together in one batch or in batches of one after another."""
    experts = session.loaded.model.experts
    before, started = experts.snapshot(), time.perf_counter()
    events = []
    for group in [list(enumerate(prompts))] if together else [[pair] for pair in enumerate(prompts)]:
        batch = Batch(session, max_sequences=len(group))
        for request_id, prompt in group:
            events += batch.join(request_id, prompt, SamplingParams(), new)
        while batch.sequences:
            events += batch.step()
    seconds = time.perf_counter() - started
    work = experts.snapshot().since(before)
    tokens = {i: [t for e in events if isinstance(e, Tokens) and e.request_id == i for t in e.token_ids]
              for i in range(len(prompts))}
    done = [e for e in events if isinstance(e, Done)]
    steps = sum(d.stats.spec.steps for d in done)
    generated = sum(len(t) for t in tokens.values())
    return {"seconds": seconds, "tok_s": generated / seconds, "tokens": generated,
            "tau": (generated - len(prompts)) / steps, "bytes_fetched_per_token": work.bytes_fetched / generated,
            "mean_batch_size": statistics.mean(d.stats.batch.mean_size for d in done), "token_ids": tokens}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--slots", type=int, default=24, help="expert cache slots (the demo has 6 x 16 experts)")
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    context = args.requests * 400
    drafter_folder, drafter = open_dflash(DEMO_DRAFTER)
    budget = budget_for_slots(DEMO_MODEL, args.slots, context) + drafter.device_bytes(drafter_folder, context, dtype)
    session = Session.load(DEMO_MODEL, SpecOptions("dflash", str(DEMO_DRAFTER), args.block_size), context=context,
                           dtype=dtype, device=args.device, gpu_budget=budget)
    heldout = json.loads((DEMO_MODEL / "heldout.json").read_text())[: args.requests]
    prompts = [session.prompt_ids(Prompt(messages=chat["messages"], reasoning_effort=chat["reasoning_effort"]))
               for chat in heldout]
    decode(session, prompts[:1], 8, True)  # warm-up
    runs = {"together": [], "one_after_another": []}
    for _ in range(args.repeats):
        for way in runs:
            runs[way].append(decode(session, prompts, args.new, way == "together"))
    figures = {way: {key: statistics.median(r[key] for r in results) for key in results[0] if key != "token_ids"}
               for way, results in runs.items()}
    same = all(r["token_ids"] == runs["one_after_another"][0]["token_ids"] for results in runs.values()
               for r in results)
    report = {
        "command": " ".join(sys.argv),
        "machine": {"cpu_count": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
                    "device": args.device, "load_average_after": os.getloadavg()},
        "model": "the bundled demo (resources/models/demo-gpt-oss) with its DFlash drafter, greedy",
        "routing": "the model's own",
        "expert_slots": session.loaded.placement.expert_slots,
        "requests": args.requests, "new_tokens": args.new, "block_size": args.block_size,
        "figures": figures, "speed_up": figures["one_after_another"]["seconds"] / figures["together"]["seconds"],
        "same_tokens": same,
        "floor": "one_after_another: the same requests decoded alone, in turn, on the same machine",
        "runs": {way: [{k: v for k, v in r.items() if k != "token_ids"} for r in results]
                 for way, results in runs.items()},
    }
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps({k: report[k] for k in ("figures", "speed_up", "same_tokens")}, indent=2))


if __name__ == "__main__":
    main()
