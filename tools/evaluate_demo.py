"""Measure the shipped demo model on this machine (CPU, float32) and write its model card.

    python tools/evaluate_demo.py [--prompts 128] [--new 128] [--routing-only]

Writes resources/models/evaluation.json and resources/models/README.md (the card, which also quotes
training.json and the benchmark results bench/results/demo-model-*.json). Measured here:
- held-out perplexity: exp of the mean negative log-likelihood of every held-out answer (its tokens
  after the prompt, through <|return|>), by transformers from the shipped MXFP4 checkpoint;
- greedy acceptance τ at blocks 4 / 8 / 16 on the first --prompts held-out prompts, each answer up to
  --new tokens (tools/demo/acceptance.py: the engine's greedy loop replayed; tests check it against the
  engine); sampled τ (temperature 0.7) comes from the engine's benchmark runs;
- routing statistics over the first --routing-chats held-out chats (tools/demo/routing.py), and the expert
  cache's hit rate while the engine generates answers to the first --cache-prompts held-out prompts with its
  experts offloaded (tools/demo/engine_cache.py), each under LRU and under the engine's eviction policy.
--routing-only measures just the routing and the cache and keeps the other figures of evaluation.json.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.text.tokenizer import ChatTokenizer
from app.paths import BUNDLED_MODELS, DEMO_DRAFTER, DEMO_MODEL
from app.plan import ROUTING_FILE
from tools.demo.acceptance import greedy_tau
from tools.demo.card import write_card
from tools.demo.chat_data import STOP_IDS, encode_chat, heldout_perplexity
from tools.demo.corpus import Chat
from tools.demo.drafter import DFlashTrainee
from tools.demo.engine_cache import engine_hit_rates
from tools.demo.routing import router_picks, routing_statistics
from tools.demo.target import load_target

BLOCK_SIZES = (4, 8, 16)
SLOT_COUNTS = (4, 8, 12)  # cached experts per layer, of the demo's 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--routing-chats", type=int, default=128, help="held-out chats the routing is read from")
    parser.add_argument("--cache-prompts", type=int, default=8, help="held-out prompts the engine answers")
    parser.add_argument("--cache-new", type=int, default=48, help="tokens per answer in the engine's cache runs")
    parser.add_argument("--routing-only", action="store_true", help="measure only the routing and the cache")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    heldout = json.loads((DEMO_MODEL / "heldout.json").read_text())
    tokenizer = ChatTokenizer.load(DEMO_MODEL)
    chats = [encode_chat(tokenizer, Chat(c["messages"], c["reasoning_effort"], c["answer"])) for c in heldout]
    target = load_target(DEMO_MODEL, torch.device("cpu"))
    routing = routing_statistics(router_picks(target, [p + a for p, a in chats[: args.routing_chats]]),
                                 target.config.num_local_experts, slot_counts=SLOT_COUNTS)
    routing["engine_cache_hit_rate"] = engine_hit_rates(DEMO_MODEL, [p for p, _ in chats[: args.cache_prompts]],
                                                        args.cache_new, SLOT_COUNTS)
    if args.routing_only:
        evaluation = json.loads((BUNDLED_MODELS / "evaluation.json").read_text())
    else:
        evaluation = measure_model(target, chats, args)
    evaluation["routing"] = routing
    (BUNDLED_MODELS / "evaluation.json").write_text(json.dumps(evaluation, indent=2))
    write_routing_record(DEMO_MODEL, routing)
    write_card(BUNDLED_MODELS)


def measure_model(target, chats, args) -> dict:
    """Held-out perplexity and greedy τ."""
    trainee = DFlashTrainee.from_folder(DEMO_DRAFTER)
    emitted, steps = dict.fromkeys(BLOCK_SIZES, 0), dict.fromkeys(BLOCK_SIZES, 0)
    for prompt, _ in chats[: args.prompts]:
        out = target.generate(input_ids=torch.tensor([prompt]), max_new_tokens=args.new, do_sample=False,
                              pad_token_id=STOP_IDS[1], eos_token_id=STOP_IDS)
        continuation = out[0, len(prompt):].tolist()
        for size in BLOCK_SIZES:
            tokens, count = greedy_tau(target, trainee, prompt, continuation, size)
            emitted[size], steps[size] = emitted[size] + tokens, steps[size] + count
    tau = {size: round(emitted[size] / steps[size], 3) for size in BLOCK_SIZES}
    print(f"greedy τ {tau}", flush=True)
    perplexity = heldout_perplexity(target, chats, torch.device("cpu"))
    print(f"held-out perplexity {perplexity:.3f} over {len(chats)} answers", flush=True)
    return {
        "machine": "this machine's CPU, float32",
        "heldout_perplexity": round(perplexity, 3), "heldout_answers": len(chats),
        "heldout_answer_tokens": sum(len(a) for _, a in chats),
        "greedy_tau": {"prompts": min(args.prompts, len(chats)), "max_new_tokens": args.new, "tau": tau},
    }


def write_routing_record(folder: Path, routing: dict) -> None:
    """The measured hit rates of the engine's eviction policy, where the planner reads them
    (app.plan.read_routing); LRU's alongside for comparison."""
    cache = routing["cache_hit_rate"]
    record = {
        "hit_rate": cache["engine_policy"], "policy": cache["policy"], "lru_hit_rate": cache["lru"],
        "source": f"tools/evaluate_demo.py: the engine's ExpertCache (slots per layer × layers) replayed over the "
                  f"routing of {routing['tokens']} tokens of held-out chats",
    }
    (folder / ROUTING_FILE).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
