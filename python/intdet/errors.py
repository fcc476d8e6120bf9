"""The one exception type the CLI turns into a one-line error and exit 1,
and the check every entry point makes of token ids."""


class IntdetError(Exception):
    """A user-facing error: the message names the file or argument and what
    is wrong, on one line. ``field``: the argument, option or request field
    it is about (e.g. "prompt", "top_p"), or None; the server reports it as
    the OpenAI error's ``param`` without parsing the message."""

    def __init__(self, message: str = "", field: str | None = None):
        super().__init__(message)
        self.field = field

    def __reduce__(self):
        # the field survives pickling (an error from a batch worker process, a Ray actor)
        return type(self), (str(self), self.field)


def check_token_ids(ids, vocab_size: int, what: str | None = None) -> None:
    """IntdetError "WHAT: token id X is outside the vocabulary [0, V)" (field
    ``what``) for the first id of ``ids`` not in [0, vocab_size); no prefix
    when what is None. The one form of this check (CLI --ids, the API, the
    scheduler, the server, bench)."""
    for t in ids:
        if not 0 <= t < vocab_size:
            where = f"{what}: " if what else ""
            raise IntdetError(f"{where}token id {t} is outside the vocabulary [0, {vocab_size})", field=what)
