"""The bundled demo model (resources/models) on held-out prompts: decode speed with speculation off and
with its DFlash drafter at fixed block sizes, and the acceptance τ (tokens per verify step), greedy and
sampled.

    python bench/demo_model.py bench/results/demo-model-cpu-DATE.json                     (this machine)
    python bench/demo_model.py OUT.json --device cuda [--target DIR --drafter DIR]        (a GPU)

Prompts are the first --prompts chats of the target folder's heldout.json (items never trained on),
rendered by its chat template; each answer is capped at --new tokens or ends at <|return|>. τ counts
all steps of all prompts together: emitted tokens / verify steps. Greedy runs also record whether the
tokens equal spec off's (they must, up to bf16 differences between a block verify and one-token steps
on a GPU); where they differ, each differing answer records where, the two tokens there, and the gap
between those two tokens' logits in the float32 transformers target given the common prefix (a gap near
zero: a near tie that bf16 rounding can flip). The floor each speculative run is compared with is spec off
on the same machine.
"""

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.generation.sampling import SamplingParams
from app.engine.session import Prompt, Session, collect, prompt_ids
from app.engine.spec.options import SpecOptions
from app.engine.text.tokenizer import ChatTokenizer
from app.paths import DEMO_DRAFTER, DEMO_MODEL


def run(session: Session, prompts: list[Prompt], temperature: float, new: int) -> dict:
    tokens, rates, steps, emitted, outputs = 0, [], 0, 0, []
    for index, prompt in enumerate(prompts):
        result = collect(session.generate(session.prompt_ids(prompt), SamplingParams(temperature, 0, 1.0, index), new))
        stats = result["stats"]
        outputs.append(result["token_ids"])
        tokens += len(result["token_ids"])
        rates.append(stats["decode_tok_s"])
        if "spec" in stats:
            steps += stats["spec"]["steps"]
            # the tokens after the prefill's first; drafts a step accepted past a stop token are not emitted
            emitted += len(result["token_ids"]) - 1
    figures = {"tokens": tokens, "decode_tok_s_median": statistics.median(rates), "decode_tok_s_mean":
               statistics.fmean(rates)}
    if steps:
        figures.update({"verify_steps": steps, "tau": emitted / steps})
    return figures | {"outputs": outputs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--target", default=str(DEMO_MODEL))
    parser.add_argument("--drafter", default=str(DEMO_DRAFTER))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--blocks", default="4,8,16,auto", help="fixed block sizes; auto: the cost-aware policy")
    parser.add_argument("--temperatures", default="0,0.7")
    args = parser.parse_args()
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    heldout = json.loads((Path(args.target) / "heldout.json").read_text())[: args.prompts]
    prompts = [Prompt(messages=chat["messages"], reasoning_effort=chat["reasoning_effort"]) for chat in heldout]
    context = 1024 + args.new
    results = []
    specs = [SpecOptions()] + [SpecOptions("dflash", args.drafter, None if b == "auto" else int(b))
                               for b in args.blocks.split(",")]
    for spec in specs:
        session = Session.load(args.target, spec, context=context, dtype=dtype, device=args.device)
        run(session, prompts[:1], 0.0, 16)  # warm-up: kernels compile on first use
        for temperature in map(float, args.temperatures.split(",")):
            started = time.monotonic()
            figures = run(session, prompts, temperature, args.new)
            block = spec.block_size or ("auto" if spec.method != "off" else None)
            entry = {"spec": spec.method, "block_size": block, "temperature": temperature, **figures,
                     "seconds": round(time.monotonic() - started, 1)}
            results.append(entry)
            print(json.dumps({k: v for k, v in entry.items() if k != "outputs"}), flush=True)
    off = {r["temperature"]: r for r in results if r["spec"] == "off"}
    for entry in results:
        entry["speedup_over_spec_off"] = entry["decode_tok_s_mean"] / off[entry["temperature"]]["decode_tok_s_mean"]
        if entry["temperature"] == 0 and entry["spec"] != "off":
            entry["greedy_tokens_equal_spec_off"] = entry["outputs"] == off[0.0]["outputs"]
            if not entry["greedy_tokens_equal_spec_off"]:
                entry["differences"] = _differences(args.target, args.device, prompts, off[0.0]["outputs"],
                                                    entry["outputs"])
    for entry in results:
        del entry["outputs"]
    report = {
        "machine": _machine(args.device), "command": " ".join(["python", *sys.argv]),
        "model": {"target": args.target, "drafter": args.drafter, "dtype": dtype},
        "prompts": len(prompts), "max_new_tokens": args.new, "floor": "spec off on the same machine",
        "runs": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))


def _differences(target: str, device: str, prompts: list[Prompt], expected: list[list[int]],
                 got: list[list[int]]) -> list[dict]:
    """Where each answer first leaves spec off's, and the float32 target's logit gap between the two tokens."""
    import torch

    reference, tokenizer = _float32_target(target, device)
    found = []
    for answer, (prompt, first, second) in enumerate(zip(prompts, expected, got, strict=True)):
        ids = prompt_ids(tokenizer, prompt)
        at = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), None)
        if at is None:
            continue
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([ids + first[:at]], device=device)).logits[0, -1].float()
        found.append({"answer": answer, "token_index": at, "spec_off_token": first[at], "this_token": second[at],
                      "float32_logit_gap": round(float(logits[first[at]] - logits[second[at]]), 4)})
    return found


@functools.cache
def _float32_target(target: str, device: str):
    """The transformers target in float32 and its tokenizer, loaded once for all runs' differences."""
    import torch

    from tools.demo.target import load_target

    return load_target(Path(target), torch.device(device)), ChatTokenizer.load(Path(target))


def _machine(device: str) -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(), "load_average": os.getloadavg()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


if __name__ == "__main__":
    main()
