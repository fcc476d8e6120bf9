"""``intdet chat``: an interactive multi-turn chat on the terminal (chat.py)."""

from __future__ import annotations

import click

from ..errors import IntdetError
from .errors import _STREAMS, _need_stdout, user_errors
from .options import _load, _make_sampler, model_options, sampling_options, stats_line, verbosity_options


@click.command()
@click.option("--system", default=None, metavar="PROMPT",
              help="System prompt (default: the chat template's own, if any).")
@model_options
@sampling_options
@verbosity_options
@click.pass_context
@user_errors
def chat(ctx, system, model, revision, weights, device, threads, max_new_tokens, temperature, top_k, top_p, min_p,
         repeat_penalty, repeat_last_n, stops, seed, quiet, verbose):
    """Interactive multi-turn chat: one message per line; /reset, /help; Ctrl-D leaves, Ctrl-C stops a reply."""
    from ..chat import run_chat
    from ..model import Engine

    _need_stdout()
    if quiet and verbose:
        raise IntdetError("-q and -v: choose one")
    sampler = _make_sampler(ctx, ctx.params)
    lm = _load(model, revision, weights, verbose, quiet)
    engine = Engine(lm, device, threads)
    run_chat(engine, lm, sampler, max_new_tokens, system=system, stop=stops, quiet=quiet or _STREAMS["stderr_closed"],
             stats_line=stats_line)
