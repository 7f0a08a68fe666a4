"""The one exception type for mistakes a user can fix: it carries a single readable line."""


class UserError(Exception):
    """Bad input (a file, a flag, a budget). Front doors print `str(error)` and exit non-zero."""


def first_line(error: BaseException) -> str:
    """An unexpected exception as one line for a message (its first line, or its type's name)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
