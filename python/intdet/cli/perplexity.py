"""``intdet perplexity``: perplexity of a text file, integer or float32 reference."""

from __future__ import annotations

import json
import os
import sys

import click

from .. import backends
from ..errors import IntdetError
from .errors import _need_stdout, user_errors
from .options import (MODEL_HELP_SHORT, device_option, json_option, model_option, read_text_file, revision_option,
                      threads_option, weights_option, _warn_revision)

TEXT_FILE_LIMIT = 256 << 20  # bytes: -f of perplexity


@click.command()
@model_option(help=MODEL_HELP_SHORT)
@click.option("-f", "--file", "file", required=True, metavar="FILE",
              help=f"UTF-8 text file to score ('-' = stdin; at most {TEXT_FILE_LIMIT >> 20} MiB).")
@click.option("--ctx", default=512, show_default=True, type=int, help="Window length in tokens.")
@click.option("--max-windows", default=None, type=int, help="Score only the first N windows.")
@click.option("--float", "use_float", is_flag=True, help="Score with the float32 reference of the same source instead.")
@click.option("--second-half", is_flag=True, help="Score only the second half of each window (llama.cpp's protocol).")
# its own help: --device picks the integer backend, --float the float one
@device_option(help=f"Integer backend: {backends.help_text()}.")
@threads_option()
@revision_option()
@json_option()
@weights_option()
@user_errors
def perplexity(model, file, ctx, max_windows, use_float, second_half, device, threads, revision, as_json, weights):
    """Perplexity of a text file: non-overlapping windows of --ctx tokens."""
    from ..model import Engine, load_model
    from ..perplexity import float_logits_fn, integer_logits_fn, perplexity as run, window_bos, windows_of
    from ..resolve import check_weights, converted_path, resolve_source
    from ..tokenizer import encode

    _need_stdout()
    if second_half and ctx < 3:  # a window of 2 predicts one token, in its first half
        raise IntdetError(f"--second-half: --ctx {ctx} leaves no prediction in the second half of a window "
                          "(use --ctx 3 or more)")
    text = read_text_file(file, "-f", TEXT_FILE_LIMIT)
    _warn_revision(revision, model)
    src = resolve_source(model, revision)
    if use_float and src is None:
        raise IntdetError("--float needs the source model (GGUF file, Hugging Face dir or repo id), not a converted dir")
    if src is None:
        check_weights(model, weights)
    lm = load_model(model if src is None else converted_path(src, progress=sys.stderr.isatty(), weights=weights or "int8"))
    if ctx > lm.cfg["context_length"]:
        raise IntdetError(f"--ctx: {ctx} exceeds the model's context length {lm.cfg['context_length']}")
    ids = encode(lm.tokenizer, lm.tok_meta, text, add_bos=False)
    wins = windows_of(ids, ctx, max_windows, bos=window_bos(lm.tok_meta))
    if use_float:
        import numpy as np

        from ..convert.sources import read_source
        from ..floatref import FloatModel

        fn, kind = float_logits_fn(FloatModel(read_source(src), np.float32, max_len=ctx)), "float32 reference"
    else:
        fn, kind = integer_logits_fn(Engine(lm, device, threads)), f"integer ({device})"
    n_bytes = lambda w: len(lm.tokenizer.decode(w).encode("utf-8"))  # noqa: E731
    r = run(fn, wins, n_bytes, progress=sys.stderr.isatty() and not as_json, second_half=second_half)
    if as_json:
        click.echo(json.dumps({**r.as_dict(), "model": os.path.basename(src or model), "kind": kind, "file": file}))
    else:
        half = (f"; second half of each window only (llama.cpp's protocol): {r.perplexity_second_half:.4f}"
                if r.perplexity_second_half is not None else "")
        click.echo(f"{kind}: perplexity {r.perplexity:.4f}, mean NLL {r.nll:.5f} nats/token, "
                   f"{r.bits_per_byte:.5f} bits/byte over {r.tokens} tokens "
                   f"({r.windows} window{'s' if r.windows != 1 else ''} of {r.ctx}) in {r.seconds:.1f} s{half}")

