"""The one exception type for mistakes a user can fix: it carries a single readable line."""


class UserError(Exception):
    """Bad input (a file, a flag, a budget). Front doors print `str(error)` and exit non-zero."""
