"""The bundled demo model (resources/models): our engine reads it as transformers does, and
`moechat generate demo` uses it, with and without its drafter."""

import json

import torch

from app.cli import main
from app.engine.loader import load_model
from app.engine.text.tokenizer import ChatTokenizer
from app.model_folder import ModelFolder
from app.paths import DEMO_DRAFTER, DEMO_MODEL
from tests.engine.greedy import our_greedy, prompt_and_decode_logits, reference_greedy
from tools.demo.target import load_target

QUESTION = "What does `json.dumps` do?"


def chat_prompt() -> list[int]:
    return ChatTokenizer.load(DEMO_MODEL).render_chat([{"role": "user", "content": QUESTION}])


def test_the_shipped_model_gives_transformers_logits_and_greedy_tokens_in_float32():
    folder = ModelFolder.open(DEMO_MODEL)
    assert folder.config["quantization_config"]["quant_method"] == "mxfp4"
    ids = chat_prompt()
    reference = load_target(DEMO_MODEL, torch.device("cpu"))
    loaded = load_model(folder, dtype="float32", context=len(ids) + 16)
    ours, expected = prompt_and_decode_logits(loaded.model, reference, ids, 4)
    assert (ours - expected).abs().max() <= 2e-4
    assert expected.std() > 1.0
    tokens = reference_greedy(reference, ids, 10)
    assert our_greedy(loaded, ids, 10) == tokens
    assert tokens[:2] == ChatTokenizer.load(DEMO_MODEL).encode("<|channel|>final")  # it learned the format


def test_moechat_generate_demo_answers_and_its_drafter_keeps_the_tokens(capsys):
    common = ["--chat", "--prompt", QUESTION, "--max-new-tokens", "8", "--json"]
    assert main(["generate", "demo", *common]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["text"].strip() and len(plain["token_ids"]) == 8
    assert main(["generate", "demo", *common, "--spec", "dflash", "--drafter", "demo", "--block-size", "4"]) == 0
    speculative = json.loads(capsys.readouterr().out)
    assert speculative["token_ids"] == plain["token_ids"]
    assert speculative["stats"]["spec"]["steps"] < 7  # some drafts were accepted


def test_the_demo_folders_are_where_an_editable_install_looks_and_fit_the_size_limit():
    sizes = [path.stat().st_size for folder in (DEMO_MODEL, DEMO_DRAFTER) for path in folder.iterdir()]
    assert sum(sizes) <= 50_000_000
    assert (DEMO_MODEL.parent / "README.md").is_file()
