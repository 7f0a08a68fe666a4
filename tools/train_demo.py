"""Train the bundled demo model: a small GPT-OSS-architecture MoE and its DFlash drafter.

    python tools/train_demo.py --smoke --out /tmp/demo            (the whole pipeline on a 2-core CPU, ~1 minute)
    python tools/evaluate_demo.py                                 (perplexity, acceptance, routing: the model card)

The shipped model came from two runs on one H200 (2.3 + 6.5 minutes; training.json records both):
    python tools/train_demo.py --device cuda --seconds 120 --target-steps 350 --target-hidden 384 --out OUT
    python tools/train_demo.py --device cuda --target-from OUT/demo-gpt-oss --seconds 375 --drafter-steps 100000

What it does, seeded (--seed, default 0) so that a run with the same Python (its standard library is the
data), the same step counts and the same device repeats itself:
1. Data (tools/demo/corpus.py): the docstrings and source of this Python's standard library and the pydoc
   language topics, as question → answer chats; 4 % of the items (by a hash of their name) are held out.
2. Tokenizer: byte-level BPE (`tokenizers`) learned from the training chats, with the harmony special tokens
   that the gpt-oss chat template uses (ids 0–8, <|return|> = 2 ends an answer) and <|reserved_mask|> (id 9),
   the drafter's mask token.
3. Target (tools/demo/target.py): transformers' GptOssForCausalLM with gpt-oss-20b's config keys at small
   sizes — attention sinks, a sliding window (8 tokens) on every other layer, YaRN RoPE, 16 experts top-4 — trained on
   packed chats; the last quarter of the steps sees its experts rounded to MXFP4 (straight-through), then it
   is exported as the published checkpoint: MXFP4 expert blocks/scales, bf16 for the rest.
4. Drafter (tools/demo/drafter.py): the target answers training prompts (2/3 greedy, 1/3 at temperature
   0.7) and, greedy, prompts about names that do not exist (where, as on held-out prompts, it has no learned
   answer); a z-lab DFlash drafter learns the target's next-token distributions along those answers, block
   by block, from the target's features.

Step counts: --target-steps / --drafter-steps (defaults in tools/demo/target.py and drafter.py). With
--seconds, each phase gets a share of that wall time and fits its step count (or the number of greedy
continuations) to it; training.json records the counts that ran, so a rerun with --target-steps,
--drafter-steps and --greedy-prompts repeats the run. Sizes: --target-hidden widens the target's residual
stream (its heads keep their sizes, as gpt-oss-20b's do; the drafter's hidden size follows), --drafter-layers
deepens the drafter.
"""

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.text.tokenizer import ChatTokenizer
from tests.fixtures.tiny_tokenizer import write_harmony_tokenizer
from tools.demo import drafter as drafting
from tools.demo import target as targeting
from tools.demo.chat_data import continuations, encode_chat, heldout_perplexity, pack
from tools.demo.corpus import as_chats, collect_items, invented_items
from tools.demo.drafter import DFlashTrainee, drafter_config, export_drafter, train_drafter
from tools.demo.drafter_data import DrafterData

TARGET_NAME, DRAFTER_NAME = "demo-gpt-oss", "demo-gpt-oss-dflash"
MASK_TOKEN = "<|reserved_mask|>"
HELDOUT_FILE = "heldout.json"
TRAINING_FILE = "training.json"
# Shares of --seconds: target training, continuations, drafter training.
TIME_SHARES = {"target": 0.5, "continuations": 0.17, "drafter": 0.33}


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    target_hidden = _target_hidden(args)
    started = time.monotonic()
    device = torch.device(args.device)
    out = Path(args.out)
    target_folder, drafter_folder = out / TARGET_NAME, out / DRAFTER_NAME

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {message}", flush=True)

    items = collect_items(smoke=args.smoke)
    train_items = [item for item in items if not item.held_out]
    heldout_items = [item for item in items if item.held_out] or items[-4:]
    train_chats, heldout_chats = as_chats(train_items, args.seed), as_chats(heldout_items, args.seed + 1)
    log(f"{len(items)} items: {len(train_chats)} training chats, {len(heldout_chats)} held out")

    if args.target_from:  # train a drafter for a target trained before
        target_folder = Path(args.target_from)
        tokenizer = ChatTokenizer.load(target_folder)
        learned, config = tokenizer.vocab_size, json.loads((target_folder / "config.json").read_text())
        model = targeting.load_target(target_folder, device)
        target_part = json.loads((target_folder.parent / TRAINING_FILE).read_text())["target"]
    else:
        vocab = 512 if args.smoke else 4096
        config = targeting.target_config(args.smoke, vocab, target_hidden)
        texts = [chat.messages[0]["content"] + "\n" + chat.answer for chat in train_chats]
        learned = write_harmony_tokenizer(target_folder, texts, vocab, extra_special_tokens=[MASK_TOKEN])
        tokenizer = ChatTokenizer.load(target_folder)
    target_layer_ids = _target_layers(args.target_layers, config["num_hidden_layers"])  # before any training
    train_ids = [encode_chat(tokenizer, chat) for chat in train_chats]
    heldout_ids = [encode_chat(tokenizer, chat) for chat in heldout_chats]
    log(f"tokenizer: {learned} tokens; {sum(len(p) + len(a) for p, a in train_ids)} training tokens")

    if not args.target_from:
        settings = targeting.SMOKE_TRAINING if args.smoke else targeting.FULL_TRAINING
        settings = replace(settings, steps=args.target_steps or settings.steps)
        model = targeting.build_target(config, settings, args.seed)
        target_report = targeting.train_target(model, pack(train_ids, settings.sequence), settings, device,
                                               args.seed, log, _share(args, "target"))
        targeting.export_target(model, config, target_folder)
        perplexity = heldout_perplexity(model, heldout_ids, device)
        log(f"target exported; held-out answer perplexity {perplexity:.2f}")
        target_part = {"config": {k: config[k] for k in targeting.FULL_SIZES},
                       "settings": asdict(replace(settings, steps=target_report["steps"])), **target_report,
                       "heldout_perplexity_at_training": round(perplexity, 3)}

    prompts = [prompt for prompt, _ in train_ids][: 6 if args.smoke else None]
    invented_count = args.invented_prompts if args.invented_prompts is not None else 4 if args.smoke else 6000
    invented = [encode_chat(tokenizer, chat)[0]
                for chat in as_chats(invented_items(items, invented_count, args.seed), args.seed + 2)]
    new_tokens = 12 if args.smoke else 320
    batch = 6 if args.smoke else 1024
    seconds = _share(args, "continuations") or float("inf")
    greedy = _interleaved(invented, (prompts[0::3] + prompts[1::3])[: args.greedy_training_prompts])
    parts = [
        continuations(model, greedy[: args.greedy_prompts], new_tokens, 0.0, batch, device, args.seed,
                      seconds * 2 / 3, log),
        continuations(model, prompts[2::3], new_tokens, 0.7, batch, device, args.seed, seconds / 3, log),
    ]
    data = DrafterData.joined(parts)
    dconfig = drafter_config(config, args.smoke, tokenizer.encode(MASK_TOKEN)[0], args.drafter_layers,
                             target_layer_ids)
    dsettings = drafting.SMOKE_TRAINING if args.smoke else drafting.FULL_TRAINING
    dsettings = replace(dsettings, steps=args.drafter_steps or dsettings.steps,
                        batch=args.drafter_batch or dsettings.batch,
                        anchors=args.drafter_anchors or dsettings.anchors,
                        learning_rate=args.drafter_lr or dsettings.learning_rate)
    torch.manual_seed(args.seed)
    trainee = DFlashTrainee(dconfig)
    drafter_report = train_drafter(trainee, dconfig, model, data, dsettings, device, args.seed, log,
                                   _share(args, "drafter"))
    export_drafter(trainee, dconfig, drafter_folder)

    heldout = [{"messages": chat.messages, "reasoning_effort": chat.reasoning_effort, "answer": chat.answer}
               for chat in heldout_chats]
    if not args.target_from:
        (target_folder / HELDOUT_FILE).write_text(json.dumps(heldout, indent=1))
    report = {
        "command": " ".join(["python", "tools/train_demo.py", *(argv if argv is not None else sys.argv[1:])]),
        "seed": args.seed, "python": platform.python_version(), "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "data": {"items": len(items), "training_chats": len(train_chats), "heldout_chats": len(heldout_chats),
                 "training_tokens": sum(len(p) + len(a) for p, a in train_ids), "tokenizer_vocab": learned},
        "target": target_part,
        "drafter": {"config": {k: dconfig[k] for k in (*drafting.FULL_SIZES, "block_size")},
                    "target_layer_ids": dconfig["dflash_config"]["target_layer_ids"],
                    "settings": asdict(replace(dsettings, steps=drafter_report["steps"])), **drafter_report,
                    "greedy_continuations": len(parts[0].lengths), "sampled_continuations": len(parts[1].lengths),
                    "invented_prompts": len(invented)},
        "seconds": round(time.monotonic() - started, 1),
    }
    (out / TRAINING_FILE).write_text(json.dumps(report, indent=2))
    log(f"done: {target_folder}, {drafter_folder}")


def _interleaved(first: list, second: list) -> list:
    """first[0], second[0], first[1], second[1], …, then the rest of the longer list."""
    common = min(len(first), len(second))
    return [x for pair in zip(first, second, strict=False) for x in pair] + first[common:] + second[common:]


def _target_layers(text: str | None, layers: int) -> tuple[int, ...] | None:
    if text is None:
        return None
    ids = tuple(int(i) for i in text.split(",") if i.strip().isdigit())
    if not ids or len(ids) != len(text.split(",")) or max(ids) >= layers:
        raise SystemExit(f"--target-layers {text!r}: give layer numbers 0 to {layers - 1}, separated by commas")
    return ids


def _share(args, phase: str) -> float | None:
    if not args.seconds:
        return None
    shares = TIME_SHARES if not args.target_from else {"continuations": 0.3, "drafter": 0.7}
    return args.seconds * shares[phase]


def _target_hidden(args) -> int | None:
    if args.target_hidden and args.target_from:
        raise SystemExit("--target-hidden sizes a new target, and --target-from trains a drafter for one trained "
                         "before: give one of them")
    if args.target_hidden and args.target_hidden % 32:
        raise SystemExit(f"--target-hidden {args.target_hidden}: give a multiple of 32 (the width of an MXFP4 group)")
    return args.target_hidden


def _count(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count: give a whole number above 0")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "resources" / "models"),
                        help="folder that receives demo-gpt-oss/, demo-gpt-oss-dflash/ and training.json")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few modules, tens of steps (CPU)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, help="wall time for the three phases together")
    parser.add_argument("--target-steps", type=_count)
    parser.add_argument("--target-hidden", type=_count,
                        help="the target's hidden size, a multiple of 32 (default in tools/demo/target.py); "
                             "the drafter's follows it")
    parser.add_argument("--drafter-steps", type=_count)
    parser.add_argument("--drafter-batch", type=_count, help="sequences per drafter step (default in drafter.py)")
    parser.add_argument("--drafter-anchors", type=_count,
                        help="anchor blocks per sequence at the largest block size (default in drafter.py)")
    parser.add_argument("--drafter-lr", type=float, help="the drafter's peak learning rate (default in drafter.py)")
    parser.add_argument("--drafter-layers", type=_count, help="drafter depth (default in tools/demo/drafter.py)")
    parser.add_argument("--target-layers", help="comma-separated target layers whose outputs the drafter reads "
                                                "(default in tools/demo/drafter.py)")
    parser.add_argument("--invented-prompts", type=int,
                        help="prompts about names that do not exist that the target also answers (default 6000, "
                             "smoke 4): its answers there resemble its answers to held-out prompts")
    parser.add_argument("--greedy-training-prompts", type=int,
                        help="answer at most this many training prompts greedily (default: two thirds of them); the "
                             "other greedy answers are to invented prompts")
    parser.add_argument("--greedy-prompts", type=_count, help="answer at most this many prompts greedily")
    parser.add_argument("--target-from", help="a target folder trained before (with training.json beside it): "
                                              "train only its drafter")
    return parser


if __name__ == "__main__":
    main()
