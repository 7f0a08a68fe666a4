"""tools/train_demo.py end to end at smoke scale: the target it exports loads in our engine and in
transformers with the same logits, the drafter it exports drafts in our engine exactly what it was
trained to draft (its batched training forward), and the greedy acceptance replay that the model card's
τ comes from counts the steps our engine's speculative loop takes."""

import json

import pytest
import torch

from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.loader import load_model
from app.engine.models.dflash import open_dflash
from app.engine.runner.step_runner import StepRunner
from app.engine.spec.dflash import DFlashSpeculation
from app.engine.spec.generate import speculative_generate
from app.model_folder import ModelFolder
from app.protocol.events import Tokens
from tests.engine.greedy import prompt_and_decode_logits
from tools.demo.acceptance import greedy_tau
from tools.demo.drafter import DFlashTrainee
from tools.demo.target import load_target
from tools.train_demo import DRAFTER_NAME, TARGET_NAME, TRAINING_FILE, main


# the smoke sizes, and a target whose residual stream (96) is wider than its 64 query features, as gpt-oss-20b's is
@pytest.fixture(scope="module", params=[[], ["--target-hidden", "96"]], ids=["smoke-sizes", "wider-target"])
def trained(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    main(["--smoke", "--out", str(out), "--target-steps", "3", "--drafter-steps", "3", "--invented-prompts", "4",
          *request.param])
    if request.param:
        assert json.loads((out / TARGET_NAME / "config.json").read_text())["hidden_size"] == 96
        assert json.loads((out / DRAFTER_NAME / "config.json").read_text())["hidden_size"] == 96
    return out


def trainee_of(trained) -> DFlashTrainee:
    """The exported drafter back in its training module."""
    return DFlashTrainee.from_folder(trained / DRAFTER_NAME)


def heldout_prompt(trained) -> list[int]:
    from app.engine.text.tokenizer import ChatTokenizer

    chat = json.loads((trained / TARGET_NAME / "heldout.json").read_text())[0]
    return ChatTokenizer.load(trained / TARGET_NAME).render_chat(chat["messages"], chat["reasoning_effort"])


def test_the_exported_target_is_a_real_mxfp4_gpt_oss_that_our_engine_and_transformers_agree_on(trained):
    folder = ModelFolder.open(trained / TARGET_NAME)
    assert folder.tensors["model.layers.0.mlp.experts.gate_up_proj_blocks"].dtype == "U8"
    assert folder.config["quantization_config"]["quant_method"] == "mxfp4"
    ids = heldout_prompt(trained)
    assert len(ids) > 8
    reference = load_target(folder.path, torch.device("cpu"))
    model = load_model(folder, dtype="float32", context=len(ids) + 8).model
    ours, expected = prompt_and_decode_logits(model, reference, ids, 4)
    assert (ours - expected).abs().max() <= 1e-4
    report = json.loads((trained / TRAINING_FILE).read_text())
    assert report["target"]["steps"] == 3 and report["drafter"]["steps"] == 3
    # continuations of 4 invented and 4 training prompts greedy, and 2 training prompts sampled
    assert report["drafter"]["sequences"] == 4 + 4 + 2


def test_our_engine_drafts_what_the_drafter_was_trained_to_draft(trained):
    ids = heldout_prompt(trained)
    target = load_model(ModelFolder.open(trained / TARGET_NAME), dtype="float32", context=len(ids) + 16).model
    speculation = DFlashSpeculation(trained / DRAFTER_NAME, None)
    speculation.load(target)
    drafter = speculation.drafter
    with torch.inference_mode():
        _, features = target.forward(torch.tensor(ids), target.new_kv_cache(len(ids)),
                                     capture=drafter.config.target_layer_ids)
    anchor, size = len(ids) - 5, 8
    block = torch.full((size,), drafter.config.mask_token_id)
    block[0] = ids[anchor]
    context = drafter.new_context_cache(len(ids) + size)
    with torch.inference_mode():
        drafter.add_context(features[:anchor], context)
        ours = drafter.draft(block, context)

    _, config = open_dflash(trained / DRAFTER_NAME)
    with torch.no_grad():
        hidden = trainee_of(trained)(target.embed[block][None, None], features[None], torch.tensor([[anchor]]))
        expected = (hidden[0, 0, 1:] @ target.lm_head.T).float()
    assert ours.shape == (size - 1, config.vocab_size)
    assert (ours - expected).abs().max() <= 1e-4
    assert expected.std() > 0.1


def test_the_greedy_acceptance_replay_counts_the_steps_our_engine_takes(trained):
    ids = heldout_prompt(trained)
    new = 12
    target = load_model(ModelFolder.open(trained / TARGET_NAME), dtype="float32", context=len(ids) + new).model
    speculation = DFlashSpeculation(trained / DRAFTER_NAME, 4)
    speculation.load(target)
    sampler = Sampler(SamplingParams(), target.device)
    events = list(speculative_generate(StepRunner(target, len(ids) + new), ids, sampler, new, [],
                                       speculation.new_drafter(len(ids) + new), 4))
    tokens = [t for event in events if isinstance(event, Tokens) for t in event.token_ids]
    engine = events[-1].stats.spec

    reference = load_target(trained / TARGET_NAME, torch.device("cpu"))
    emitted, steps = greedy_tau(reference, trainee_of(trained), ids, tokens, 4)
    assert steps == engine.steps
    assert emitted == sum(engine.accepted_per_step) + engine.steps == new - 1
