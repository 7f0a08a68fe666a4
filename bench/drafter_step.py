"""Time of one training step of the demo drafter (tools/demo/drafter.py's DrafterSteps) against the batch size:
how many sequences per second the drafter's share of tools/train_demo.py's time can train on.

    python bench/drafter_step.py bench/results/drafter-step-cpu-DATE.json --batches 4,8 --steps 6   (this machine)
    python bench/drafter_step.py OUT.json --device cuda                                           (a GPU)

The rows are random tokens with the lengths of the target's answers in the shipped run (prompt ~40 tokens,
answer up to 320): a step's cost depends on the shapes, not the values. The target is the bundled demo
target; its stored outputs are computed once, as in training. Each batch size runs --warmup steps, then
--steps timed ones (all three block sizes, in turn) and a wait for the device at the end. The warm-up is long
because on a GPU the first steps pay for the allocator growing and for new context widths: after 6 of them,
batch 128 measured 342 ms a step, after 60 of them 61 ms (training runs, on shorter real answers: 52 ms).
The floor is the shipped drafter's own run (resources/models/training.json): its drafter seconds over its steps.
"""

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.paths import BUNDLED_MODELS, DEMO_DRAFTER, DEMO_MODEL
from bench.decode_gpt_oss import cpu_machine, machine
from tools.demo.drafter import FULL_TRAINING, DFlashTrainee, DrafterSteps
from tools.demo.drafter_data import DrafterData
from tools.demo.target import load_target
from tools.demo.target_outputs import TargetOutputs


def random_rows(count: int, vocab: int, generator: torch.Generator) -> DrafterData:
    lengths = zip(torch.randint(30, 60, (count,), generator=generator).tolist(),
                  torch.randint(60, 321, (count,), generator=generator).tolist(), strict=True)
    pairs = [(torch.randint(10, vocab, (prompt,), generator=generator).tolist(),
              torch.randint(10, vocab, (answer,), generator=generator).tolist()) for prompt, answer in lengths]
    return DrafterData.from_pairs(pairs, pad_id=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--batches", default="64,128,256,512")
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    device = torch.device(args.device)
    target = load_target(DEMO_MODEL, device)
    dconfig = json.loads((DEMO_DRAFTER / "config.json").read_text())  # the shipped drafter's sizes
    training_report = json.loads((BUNDLED_MODELS / "training.json").read_text())
    shipped = training_report["drafter"]
    data = random_rows(args.rows, dconfig["vocab_size"], torch.Generator().manual_seed(0))
    started = time.monotonic()
    outputs = TargetOutputs.compute(target, data, dconfig["dflash_config"]["target_layer_ids"], device)
    wait(device)
    outputs_seconds = time.monotonic() - started
    runs = []
    for batch in map(int, args.batches.split(",")):
        torch.manual_seed(0)
        settings = replace(FULL_TRAINING, batch=batch)
        training = DrafterSteps(DFlashTrainee(dconfig), dconfig, target, outputs, data, settings, device, seed=0)
        total = args.warmup + args.steps
        for step in range(args.warmup):
            training.step(step, total)
        wait(device)
        started = time.monotonic()
        for step in range(args.warmup, total):
            training.step(step, total)
        wait(device)
        ms = (time.monotonic() - started) / args.steps * 1000
        runs.append({"batch": batch, "ms_per_step": round(ms, 2), "sequences_per_s": round(batch * 1000 / ms, 1)})
        print(json.dumps(runs[-1]), flush=True)
    report = {
        "command": " ".join(["python", *sys.argv]),
        "machine": machine() if device.type == "cuda" else cpu_machine(),
        "drafter": {"layers": dconfig["num_hidden_layers"], "anchors": FULL_TRAINING.anchors,
                    "target_layer_ids": dconfig["dflash_config"]["target_layer_ids"]},
        "rows": args.rows, "target_outputs_seconds": round(outputs_seconds, 2), "runs": runs,
        "floor": {"what": "the shipped drafter's run (resources/models/training.json), on its own machine",
                  "device": training_report["device"],
                  "batch": shipped["settings"]["batch"],
                  "ms_per_step": round((shipped["seconds"] - shipped["target_outputs_seconds"]) / shipped["steps"]
                                       * 1000, 2)},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


def wait(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
