"""The one exception type the CLI turns into a one-line error and exit 1."""


class IntdetError(Exception):
    """A user-facing error: the message names the file or argument and what
    is wrong, on one line."""
