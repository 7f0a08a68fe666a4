"""Continuous batching on an offloaded MoE: N greedy sequences decoded together (app/engine/generation/batch.py)
against the same N one after another, with the experts in a few cache slots. Reports aggregate decode
tok/s and the expert bytes copied per generated token, the figure batching exists to cut (one expert
sweep per step serves every sequence's token).

    .venv/bin/python -m bench.batch_decode [--sizes 1,2,4,8] [--tokens 32] [--slots 6]

CPU only (float32, the tiny GPT-OSS test model): it measures the mechanism, not a GPU's speed; the
bytes per token do not depend on the machine, the tok/s do (and on whatever else runs on it).
Writes bench/results/batch-decode-cpu-DATE.json.
"""

import argparse
import json
import os
import platform
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

from app.engine.generation.batch import Batch
from app.engine.generation.sampling import SamplingParams
from app.engine.session import Session
from app.protocol.events import Tokens
from tests.fixtures.tiny_gpt_oss import write_tiny_gpt_oss
from tests.test_cli_spec import budget_for_slots

CONTEXT = 2048


def prompts(count: int) -> list[list[int]]:
    return [[5 + i, 6 + 3 * i, 7, 11 + i] for i in range(count)]


def run(session: Session, sequences: list[list[int]], tokens: int, together: bool) -> dict:
    """Decode `sequences` (greedy, `tokens` each) together in one Batch, or one Batch after another."""
    experts = session.loaded.model.experts
    before, started, generated = experts.snapshot(), time.perf_counter(), 0
    groups = [sequences] if together else [[s] for s in sequences]
    for group in groups:
        batch = Batch(session, max_sequences=len(group))
        events = [e for i, prompt in enumerate(group) for e in batch.join(i, prompt, SamplingParams(), tokens)]
        while batch.sequences:
            events += batch.step()
        generated += sum(len(e.token_ids) for e in events if isinstance(e, Tokens))
    seconds = time.perf_counter() - started
    work = experts.snapshot().since(before)
    return {"tokens": generated, "seconds": seconds, "tok_s": generated / seconds,
            "bytes_fetched_per_token": work.bytes_fetched / generated, "misses_per_token": work.misses / generated}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,2,4,8")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--slots", type=int, default=6, help="expert cache slots (the tiny model has 32 experts)")
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        model = write_tiny_gpt_oss(Path(folder))
        session = Session.load(model, context=CONTEXT, dtype="float32",
                               gpu_budget=budget_for_slots(model, args.slots, CONTEXT))
        run(session, prompts(1), 4, True)  # warm-up: first calls allocate and fill the cache
        rows = []
        for size in map(int, args.sizes.split(",")):
            sequences = prompts(size)
            rows.append({"sequences": size, "together": run(session, sequences, args.tokens, True),
                         "one_after_another": run(session, sequences, args.tokens, False)})
            print(json.dumps(rows[-1]))
    result = {
        "machine": {"cpu_count": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
                    "device": "cpu", "load_average_after": os.getloadavg()},  # other work on the machine skews tok/s
        "command": f"python -m bench.batch_decode --sizes {args.sizes} --tokens {args.tokens} --slots {args.slots}",
        "model": "tiny GPT-OSS test checkpoint (4 layers, 8 experts each, top-2), float32",
        "expert_slots": args.slots,
        "rows": rows,
        "floor": "one_after_another: the same sequences decoded alone, as before batching",
    }
    out = Path(__file__).parent / "results" / f"batch-decode-cpu-{date.today()}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
