"""The `moechat` command's argument types: each reads one flag's text or says in one line what is wrong."""

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

from app.errors import UserError
from app.plan_cpu_tier import host_cores
from app.request_limits import check_seed, check_temperature, check_text, check_top_k, check_top_p
from app.sizes import parse_size

API_KEY_VARIABLE = "MOECHAT_API_KEY"


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr (the usage is one `--help` away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _checked(read: Callable, check: Callable, kind: str) -> Callable:
    def argument(text: str):
        try:
            value = read(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {kind}") from None
        try:
            return check(value)
        except UserError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return argument


def _whole(text: str) -> int:
    return int(text.strip(), 10)


temperature = _checked(float, check_temperature, "a number")
top_p = _checked(float, check_top_p, "a number")
top_k = _checked(_whole, check_top_k, "a whole number")
seed = _checked(_whole, check_seed, "a whole number")
text = _checked(str, check_text, "text")


def size(text: str) -> int:
    try:
        return parse_size(text)
    except UserError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_size(text: str) -> int:
    value = size(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size above 0")
    return value


def sizes(text: str) -> int | tuple[int, ...]:
    """One size, or several separated by commas (a budget per GPU)."""
    parts = tuple(size(part) for part in text.split(","))
    return parts if len(parts) > 1 else parts[0]


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number ≥ 1")
    return int(text)


def bounded_int(low: int, high: int, high_is: str = "") -> Callable[[str], int]:
    """`high_is`: what the highest value is, said after it."""
    def argument(text: str) -> int:
        if not text.strip().isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number from {low} to {high}{high_is}")
        return int(text)

    return argument


port = bounded_int(1, 65535)


def cpu_threads(text: str) -> int:
    """Cores computing experts beside the GPU: 0 (none) up to the cores moechat may run on."""
    return bounded_int(0, host_cores(), " (the cores of this machine)")(text)


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds above 0")
    return value


def token_ids(text: str) -> list[int]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not all(part.lstrip("-").isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of token ids, e.g. 1,2,3")
    return [int(part) for part in parts]


def api_key(given: str | None, key_file: str | None) -> str | None:
    """The server's key: --api-key, else the first line of --api-key-file, else $MOECHAT_API_KEY (a key on
    the command line is visible to every local user in `ps`)."""
    if given is not None and key_file is not None:
        raise UserError("give the key once: --api-key or --api-key-file, not both")
    if key_file is not None:
        try:
            lines = Path(key_file).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise UserError(f"cannot read the key file '{key_file}': {getattr(error, 'strerror', None) or error}") \
                from None
        given = lines[0] if lines else ""
    elif given is None:
        given = os.environ.get(API_KEY_VARIABLE)
    if given is not None and not given.strip():
        raise UserError("the API key is empty: give a key of at least one character")
    return given.strip() if given is not None else None
