"""``intdet random-model``: a Hugging Face checkpoint with deterministic random weights."""

from __future__ import annotations

import click

from ..errors import IntdetError
from .errors import user_errors

# intdet.random_model.SHAPES, spelled out here so that --help needs no import
# of numpy (tests/cli/test_entry_points.py checks the two agree).
RANDOM_MODEL_SHAPES = ("qwen3-0.6b", "tiny-llama", "tiny-qwen3", "tiny-gemma3", "qwen3-1.7b", "qwen3-4b", "llama3-8b")


@click.command("random-model")
@click.argument("out_dir")
# the choices are random_model.SHAPES, spelled out so that importing the CLI does not import numpy
@click.option("--shape", type=click.Choice(list(RANDOM_MODEL_SHAPES)), default="qwen3-0.6b",
              show_default=True, help="Architecture and size of the checkpoint.")
@click.option("--seed", default=0, type=click.IntRange(0, 2**64 - 1), show_default=True,
              help="Seed of the random weights, in [0, 2^64).")
@click.option("--jobs", default=1, type=click.IntRange(1, 1024), show_default=True,
              help="Worker processes writing the tensors side by side (the same bytes).")
@user_errors
def random_model(out_dir, shape, seed, jobs):
    """Write a Hugging Face checkpoint with deterministic random weights (then `intdet convert` it)."""
    import time

    from ..random_model import write_random_model

    if not out_dir.strip():  # '' would mean the current directory
        raise IntdetError("OUT: empty path")
    t0 = time.monotonic()
    log = lambda msg: click.echo(f"{time.monotonic() - t0:7.1f}s {msg}", err=True)  # noqa: E731
    write_random_model(out_dir, shape, seed, log=log, jobs=jobs)
    log(f"wrote {out_dir}")

