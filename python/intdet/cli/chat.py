"""``intdet chat``: an interactive multi-turn chat on the terminal (chat.py)."""

from __future__ import annotations

import json

import click

from ..errors import IntdetError
from .errors import _STREAMS, _need_stdout, user_errors
from .options import (_load, _make_sampler, model_options, read_text_file, sampling_options, stats_line,
                      verbosity_options)

TOOLS_FILE_LIMIT = 4 << 20  # bytes of a --tools file


@click.command()
@click.option("--system", default=None, metavar="PROMPT",
              help="System prompt (default: the chat template's own, if any).")
@click.option("--tools", "tools_file", default=None, metavar="FILE.json",
              help="OpenAI tool definitions (a JSON list of {\"type\": \"function\", \"function\": {...}}): "
                   "each reply's calls are printed as JSON lines; /tool TEXT answers one.")
@click.option("--tool-choice", default=None, metavar="auto|none|required|NAME",
              help="With --tools: auto (default), none, required, or the name of the function to call.")
@model_options
@sampling_options
@verbosity_options
@click.pass_context
@user_errors
def chat(ctx, system, tools_file, tool_choice, model, revision, weights, device, threads, max_new_tokens, temperature,
         top_k, top_p, min_p, repeat_penalty, repeat_last_n, stops, seed, quiet, verbose):
    """Interactive multi-turn chat: one message per line; /reset, /help; Ctrl-D leaves, Ctrl-C stops a reply."""
    from ..chat import run_chat
    from ..model import Engine

    _need_stdout()
    if quiet and verbose:
        raise IntdetError("-q and -v: choose one")
    sampler = _make_sampler(ctx, ctx.params)
    tools = read_tools(tools_file, tool_choice)
    if tool_choice not in (None, "auto", "none", "required"):
        tool_choice = {"type": "function", "function": {"name": tool_choice}}
    lm = _load(model, revision, weights, verbose, quiet)
    engine = Engine(lm, device, threads)
    try:
        run_chat(engine, lm, sampler, max_new_tokens, system=system, stop=stops,
                 quiet=quiet or _STREAMS["stderr_closed"], stats_line=stats_line, tools=tools, tool_choice=tool_choice)
    except IntdetError as e:  # the tool fields as the options that carry them
        msg, field = str(e), e.field or ""
        if field.startswith("tool_choice"):
            raise IntdetError("--tool-choice: " + msg.split(": ", 1)[-1]) from None
        if field.startswith("tools"):
            raise IntdetError(f"--tools {tools_file}: " + (msg[len("tools: "):] if msg.startswith("tools: ") else msg)) \
                from None
        raise


def read_tools(path, tool_choice):
    """The tool definitions of --tools FILE (a JSON list), or None;
    IntdetError naming the option."""
    if path is None:
        if tool_choice is not None:
            raise IntdetError("--tool-choice: needs --tools")
        return None
    text = read_text_file(path, "--tools", TOOLS_FILE_LIMIT)
    try:
        tools = json.loads(text)
    except ValueError as e:
        raise IntdetError(f"--tools: {path}: not valid JSON ({e})") from None
    if not isinstance(tools, list) or not tools:
        raise IntdetError(f"--tools: {path}: must be a non-empty JSON list of tool definitions")
    return tools
