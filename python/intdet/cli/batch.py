"""``intdet batch``: run a JSONL file of items (batch/items.py) into a JSONL
file of records (batch/tasks.py) on a local worker pool, Ray or Dask.

Rerunning with the same -o skips the items already there (a crash leaves no
corrupt line). The records are in input order unless --unordered. At the end
one JSON line on stdout totals the whole output file (items, errors, and
per task: generated tokens, summed score log-probability, corpus perplexity
from the integer NLL), the same whatever engine, workers or batch size ran it.
"""

from __future__ import annotations

import json
import sys

import click

from ..errors import IntdetError
from .errors import user_errors
from .options import _log, model_options


@click.command("batch")
@click.argument("input_path", metavar="IN.jsonl", type=click.Path(dir_okay=False))
@model_options
@click.option("-o", "--output", "output_path", required=True, metavar="OUT.jsonl", type=click.Path(dir_okay=False),
              help="Output records (appended to and resumed when it exists).")
@click.option("--task", type=click.Choice(["generate", "score", "perplexity", "compress"]), default="generate",
              show_default=True, help="Task of items without a 'task' field.")
@click.option("--engine", type=click.Choice(["local", "ray", "dask"]), default="local", show_default=True,
              help="local: worker processes here; ray: Ray Data map_batches; dask: Dask workers.")
@click.option("--workers", default=1, show_default=True, type=int,
              help="Worker processes / Ray actors / Dask workers, each loading the model once (local 0: this process).")
@click.option("--address", default=None, metavar="ADDR",
              help="Existing cluster: Ray address (auto, ray://HOST:10001) or Dask scheduler (tcp://HOST:8786).")
@click.option("--batch-size", default=16, show_default=True, type=int, help="Items sent to a worker at a time.")
@click.option("--prefix-cache", is_flag=True,
              help="Reuse the KV cache of prompts' shared starts within a worker (same records, faster few-shot).")
@click.option("--receipts", is_flag=True,
              help="Every generate record carries a receipt (result.receipt) that `intdet verify` replays.")
@click.option("--unordered", is_flag=True, help="Write records as they finish instead of in input order.")
@click.option("--no-progress", is_flag=True, help="No progress bar (it shows only on a terminal anyway).")
@user_errors
def batch(input_path, output_path, model, revision, weights, device, threads, task, engine, workers, address,
          batch_size, prefix_cache, receipts, unordered, no_progress):
    """Run the items of IN.jsonl (one JSON object with an id per line) into OUT.jsonl."""
    from ..batch.runner import run_job

    # a job re-reads its input and appends to its output to resume: both are files
    if input_path == "-":
        raise IntdetError("IN.jsonl: '-' (stdin) is not supported: give a file (a job re-reads it to resume)")
    if output_path == "-":
        raise IntdetError("-o -: stdout is not supported: give a file (a job appends to it and resumes from it)")
    if address and engine == "local":  # the library's message names no option
        raise IntdetError("--address: only for --engine ray or dask")

    summary = run_job(input_path, output_path, model=model, task=task, engine=engine, workers=workers,
                      address=address, batch_size=batch_size, threads=threads or None, device=device,
                      unordered=unordered, progress=sys.stderr.isatty() and not no_progress, revision=revision,
                      notice=_log(True), weights=weights, prefix_cache=prefix_cache,
                      receipts=receipts)
    click.echo(json.dumps(summary, sort_keys=True))
