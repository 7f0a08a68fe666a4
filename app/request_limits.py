"""What one generation may ask for, checked the same way by every front door (the CLI, the server, the
engine itself) so that a bad value is one clear error, never a failure deep in sampling.

Each check returns the value or raises a UserError that says what is allowed; the caller names the flag
or field in front of it.
"""

import math

from app.errors import UserError

MIN_TEMPERATURE = 1e-3  # below it logits / temperature overflows float32: 0 is greedy
MAX_TEMPERATURE = 2.0
SEED_LIMIT = 1 << 64  # torch's generators take 64-bit seeds
MAX_TOP_K = 1 << 20


def check_temperature(value: float) -> float:
    if value == 0 or (math.isfinite(value) and MIN_TEMPERATURE <= value <= MAX_TEMPERATURE):
        return value
    raise UserError(f"{value} is not a temperature this engine samples at: use 0 (greedy) or "
                    f"{MIN_TEMPERATURE} … {MAX_TEMPERATURE:g}")


def check_top_p(value: float) -> float:
    if math.isfinite(value) and 0 < value <= 1:
        return value
    raise UserError(f"{value} is not a top-p: use a share of the probability mass above 0 and at most 1")


def check_top_k(value: int) -> int:
    if 0 <= value <= MAX_TOP_K:
        return value
    raise UserError(f"{value} is not a top-k: use 0 (no limit) or a number of tokens up to {MAX_TOP_K}")


def check_seed(value: int | None) -> int | None:
    if value is None or 0 <= value < SEED_LIMIT:
        return value
    raise UserError(f"{value} is not a seed: use a whole number from 0 to 2^64 - 1")


def check_text(text: str) -> str:
    """Text that can be tokenized: a lone surrogate (JSON's "\\ud800" alone, or an argument's bytes that
    are not UTF-8) cannot be."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise UserError(f"the text is not valid Unicode: a lone surrogate ({text[error.start]!a}) at character "
                        f"{error.start}") from None
    return text
