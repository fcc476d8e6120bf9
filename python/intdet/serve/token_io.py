"""Token-in/token-out and receipts in the responses (docs/receipts.md):
``"return_token_ids": true`` (vLLM's) adds the prompt's and each choice's
token ids; ``"receipt": true`` adds each choice's receipt (receipts.py),
which ``intdet verify`` replays. The endpoints call these on the choice
dicts and stream chunks they build."""

from __future__ import annotations


def params(sp, r):
    """The SamplingParams ``sp`` of request body ``r``, with its receipt asked when ``r`` asks."""
    sp.receipt = bool(r.receipt)
    return sp


def add_to_choice(choice: dict, c, r, prompt_ids: bool = True) -> dict:
    """``choice`` (a whole response's, of Completion ``c``) with
    ``token_ids`` (and ``prompt_token_ids`` when ``prompt_ids``: completions
    carry them per choice, chat once per response, as vLLM) and ``receipt``
    as ``r`` asks. A choice the drain aborted has the receipt of the tokens
    its client received (finish_reason "cancelled"), which replays."""
    if r.return_token_ids:
        if prompt_ids:
            choice["prompt_token_ids"] = list(c.prompt_ids)
        choice["token_ids"] = list(c.tokens)
    if r.receipt:
        choice["receipt"] = c.receipt
    return choice


def add_to_delta(d: dict, ev, r, c=None) -> dict:
    """A streamed choice ``d``: the event's token id (``token_ids``, empty
    for a chunk of held-back text) when ``r.return_token_ids``; on the last
    chunk (``c``: the choice's Completion) the receipt when ``r.receipt``."""
    if ev.kind == "token" and r.return_token_ids:
        d["token_ids"] = [] if ev.token is None else [ev.token]
    if ev.kind == "done" and r.receipt:
        d["receipt"] = c.receipt
    return d
