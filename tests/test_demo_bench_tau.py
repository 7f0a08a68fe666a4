"""bench/demo_model.py's τ is emitted tokens per verify step, as the model card's acceptance replay counts them:
drafts that a step accepted past the answer's stop token are not emitted and do not count."""

import json

import torch

from app.engine.session import Prompt, Session
from app.engine.spec.options import SpecOptions
from app.engine.text.tokenizer import ChatTokenizer
from app.paths import DEMO_DRAFTER, DEMO_MODEL
from bench.demo_model import run
from tools.demo.acceptance import greedy_tau
from tools.demo.chat_data import encode_chat
from tools.demo.corpus import Chat
from tools.demo.drafter import DFlashTrainee
from tools.demo.target import load_target

BLOCK = 8


def test_the_benchmarks_tau_is_the_replays_on_answers_that_stop_inside_a_block():
    chats = json.loads((DEMO_MODEL / "heldout.json").read_text())[:2]  # the first answer stops mid-block
    session = Session.load(str(DEMO_MODEL), SpecOptions("dflash", str(DEMO_DRAFTER), BLOCK), context=512,
                           dtype="float32", device="cpu")
    figures = run(session, [Prompt(messages=c["messages"], reasoning_effort=c["reasoning_effort"]) for c in chats],
                  0.0, 64)

    target, tokenizer = load_target(DEMO_MODEL, torch.device("cpu")), ChatTokenizer.load(DEMO_MODEL)
    trainee = DFlashTrainee.from_folder(DEMO_DRAFTER)
    emitted = steps = 0
    for chat, answer in zip(chats, figures["outputs"], strict=True):
        prompt, _ = encode_chat(tokenizer, Chat(chat["messages"], chat["reasoning_effort"], chat["answer"]))
        tokens, count = greedy_tau(target, trainee, prompt, answer, BLOCK)
        emitted, steps = emitted + tokens, steps + count
    assert figures["verify_steps"] == steps
    assert figures["tau"] == emitted / steps
