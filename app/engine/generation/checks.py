"""What every generation checks first, when it ends, and the figures its Done event carries."""

import time

from app.errors import UserError
from app.protocol.kinds import StopReason
from app.protocol.stats import CacheStats, GenerationStats


def check_prompt(prompt_ids: list[int], vocab_size: int) -> None:
    if not prompt_ids:
        raise UserError("the prompt is empty: give some text or token ids")
    bad = [i for i in prompt_ids if not 0 <= i < vocab_size]
    if bad:
        raise UserError(f"token id {bad[0]} is outside the vocabulary (0 … {vocab_size - 1})")


def stop_reason(
    token: int, emitted: int, max_new_tokens: int, stop_ids: list[int], cache_length: int, capacity: int
) -> StopReason | None:
    """Why the generation ends once `token` is out as its `emitted`-th token (the cache then holds
    `cache_length` tokens, the prompt and every emitted token but this one), or None."""
    if token in stop_ids:
        return StopReason.STOP
    if emitted >= max_new_tokens:
        return StopReason.LENGTH
    if cache_length >= capacity:
        return StopReason.CONTEXT
    return None


def generation_stats(prompt_tokens: int, emitted: int, started: float, first_token_at: float,
                     expert_cache: CacheStats) -> GenerationStats:
    """Done's statistics, up to now: `emitted` tokens, the first at `first_token_at` (from the prefill)."""
    decode_seconds = time.perf_counter() - first_token_at
    return GenerationStats(prompt_tokens, emitted - 1, first_token_at - started,
                           (emitted - 1) / decode_seconds if decode_seconds > 0 else 0.0, expert_cache)
