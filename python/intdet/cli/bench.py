"""``intdet bench``: prompt-processing and decode speed, one row per --threads."""

from __future__ import annotations

import json
import sys

import click

from .errors import _need_stdout, user_errors
from .options import MODEL_HELP_SHORT, _cap_threads, _log, json_option, model_option, revision_option, weights_option


@click.command()
@model_option(help=MODEL_HELP_SHORT)
@click.option("--prompt-tokens", default=512, show_default=True, type=int, help="Prompt length for prompt processing.")
@click.option("--gen-tokens", default=128, show_default=True, type=int, help="Greedy tokens to decode.")
# not threads_option: repeatable (one row each), no default
@click.option("--threads", multiple=True, type=int, metavar="N", callback=_cap_threads,
              help="Thread count, at most the cores; repeat for one row each (default: 0, auto).")
@click.option("--batch", default=1, show_default=True, type=int, help="Also decode B sequences together (forward_batch).")
@revision_option()
@json_option()
@weights_option()
@user_errors
def bench(model, prompt_tokens, gen_tokens, threads, batch, revision, as_json, weights):
    """Prompt-processing and decode speed, peak RSS, ISA and threads: one row per --threads."""
    _need_stdout()
    from ..bench import format_table, run_bench
    from ..model import load_model
    from ..resolve import resolve_model

    lm = load_model(resolve_model(model, revision, progress=sys.stderr.isatty(), weights=weights,
                                  notice=_log(True)))
    show = (lambda msg: click.echo(f"  {msg}", err=True)) if sys.stderr.isatty() and not as_json else None
    rows = run_bench(lm, prompt_tokens, gen_tokens, threads or (0,), batch, progress=show)
    click.echo(json.dumps({"model": lm.path, "rows": rows}) if as_json else format_table(rows))
