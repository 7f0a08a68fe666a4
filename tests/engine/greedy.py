"""Greedy decoding helpers shared by the oracle tests: transformers' own loop, and ours."""

import torch

from app.engine.generate import generate
from app.engine.protocol import Done, Tokens
from app.engine.sampling import Sampler, SamplingParams


def reference_greedy(model, ids: list[int], count: int) -> list[int]:
    """`count` greedy tokens from a transformers model, re-running the whole sequence each step."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(count):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-count:]


def greedy_with_stats(loaded, ids: list[int], count: int) -> tuple[list[int], dict]:
    """Our engine's greedy tokens (no stop tokens) and the Done event's statistics."""
    model = loaded.model
    events = list(generate(model, model.new_kv_cache(len(ids) + count), ids,
                           Sampler(SamplingParams(), model.device), count, stop_ids=[]))
    tokens = [t for event in events if isinstance(event, Tokens) for t in event.token_ids]
    return tokens, events[-1].stats if isinstance(events[-1], Done) else {}


def our_greedy(loaded, ids: list[int], count: int) -> list[int]:
    return greedy_with_stats(loaded, ids, count)[0]
