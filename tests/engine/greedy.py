"""Helpers shared by the oracle tests: greedy decoding (transformers' own loop, and ours) and the rewind check."""

import torch

from app.engine.generation.generate import generate
from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.runner.step_runner import StepRunner
from app.protocol.events import Done, Tokens
from app.protocol.stats import GenerationStats


def reference_greedy(model, ids: list[int], count: int) -> list[int]:
    """`count` greedy tokens from a transformers model, re-running the whole sequence each step."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(count):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-count:]


def greedy_with_stats(loaded, ids: list[int], count: int) -> tuple[list[int], GenerationStats]:
    """Our engine's greedy tokens (no stop tokens) and the Done event's statistics."""
    model = loaded.model
    events = list(generate(StepRunner(model, len(ids) + count), ids,
                           Sampler(SamplingParams(), model.device), count, stop_ids=[]))
    tokens = [t for event in events if isinstance(event, Tokens) for t in event.token_ids]
    assert isinstance(events[-1], Done)
    return tokens, events[-1].stats


def our_greedy(loaded, ids: list[int], count: int) -> list[int]:
    return greedy_with_stats(loaded, ids, count)[0]


def prompt_and_decode_logits(model, reference, ids: list[int], steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ours, the reference's) logits [len(ids) + steps - 1, V] over the prompt and then `steps - 1`
    decode steps that feed the reference's own greedy tokens one at a time into our cache."""
    cache = model.new_kv_cache(len(ids) + steps)
    with torch.inference_mode():
        ours = [model.forward(torch.tensor(ids), cache)]
        continuation = reference_greedy(reference, ids, steps)
        for token in continuation[:-1]:
            ours.append(model.forward(torch.tensor([token]), cache))
        expected = reference(torch.tensor([ids + continuation[:-1]])).logits[0]
    return torch.cat(ours), expected


def rewound_and_fresh_logits(model, prompt: torch.Tensor, capacity: int = 40) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Feed `prompt` and a draft that is then rejected (truncate), then two other tokens: their logits, the
    logits a fresh cache gives for the same two after the prompt, and the rewound cache's length."""
    cache = model.new_kv_cache(capacity)
    with torch.inference_mode():
        model.forward(prompt, cache)
        model.forward(torch.tensor([5, 6, 7, 8]), cache)  # a rejected draft
        cache.truncate(len(prompt))
        rewound = model.forward(torch.tensor([30, 31]), cache)
        fresh = model.forward(torch.cat([prompt, torch.tensor([30, 31])]), model.new_kv_cache(capacity))[-2:]
    return rewound, fresh, cache.length
