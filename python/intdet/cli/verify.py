"""``intdet verify FILE``: replay the receipts of a JSON or JSONL file on this
machine and print, per receipt, match or the first divergent step; exit 1
on any mismatch (receipts.py, docs/receipts.md)."""

from __future__ import annotations

import json
import os
import sys

import click

from ..errors import IntdetError
from .errors import _err, _need_stdout, user_errors
from .options import _load, model_options

VERIFY_FILE_LIMIT = 1 << 30  # bytes of receipts read into memory at most
DEFAULT_MAX_BATCH = 64  # receipts replayed at once (the scheduler's batch)


def read_receipts(path: str) -> list:
    """[(where, receipt)] of a JSON file (one value) or a JSONL file (one
    value a line, blank lines skipped); IntdetError naming the file and line."""
    from ..receipts import check_receipt, receipts_in

    if path != "-" and not os.path.isfile(path):
        raise IntdetError(f"{path}: no such file")
    if path != "-" and os.path.getsize(path) > VERIFY_FILE_LIMIT:
        raise IntdetError(f"{path}: larger than {VERIFY_FILE_LIMIT >> 20} MiB")
    if path == "-":
        raw = sys.stdin.buffer.read(VERIFY_FILE_LIMIT + 1)
    else:
        with open(path, "rb") as f:
            raw = f.read(VERIFY_FILE_LIMIT + 1)
    if len(raw) > VERIFY_FILE_LIMIT:
        raise IntdetError(f"{path}: larger than {VERIFY_FILE_LIMIT >> 20} MiB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise IntdetError(f"{path}: not UTF-8 text (byte {e.start})") from None
    try:
        values = [(path, json.loads(text))]
    except ValueError:  # not one JSON value: JSON lines
        values = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                values.append((f"{path}:{n}", json.loads(line)))
            except ValueError as e:
                raise IntdetError(f"{path}:{n}: not JSON ({str(e)[:100]})") from None
    out, skipped = [], 0
    for where, v in values:
        try:
            found = receipts_in(v, where)
        except IntdetError:
            if len(values) == 1:
                raise
            skipped += 1  # a JSONL record without one (a score item, an error record): not a receipt to check
            continue
        for w, r in found:
            out.append((w, check_receipt(r, w)))
    if not out:
        raise IntdetError(f"{path}: no receipts")
    if skipped:
        _err(f"{path}: {skipped} record(s) hold no receipt (skipped)")
    return out


@click.command()
@click.argument("file", metavar="FILE")
@model_options
@click.option("--max-batch", default=DEFAULT_MAX_BATCH, show_default=True, type=click.IntRange(1, 1024),
              help="Receipts replayed together in one batch.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the mismatches and the summary.")
@user_errors
def verify(file, model, revision, weights, device, threads, max_batch, quiet):
    """Replay the receipts in FILE (JSON or JSONL: receipts, `intdet generate --json` objects, `intdet batch
    --receipts` records, saved server responses) and print match or the first divergent step of each; exit 1 on
    any mismatch."""
    from ..api import LLM
    from ..receipts import replay

    _need_stdout()
    receipts = read_receipts(file)
    lm = _load(model, revision, weights, False, quiet)
    llm = LLM(lm, device, threads, max_batch=max_batch, prefix_cache=False)
    name = f"-m {model}" if model is not None else "the default model"
    verdicts = replay(llm, receipts, model_name=name)
    bad = [v for v in verdicts if not v.ok]
    for v in verdicts:
        if not v.ok or not quiet:
            click.echo(v.line())
    _err(f"{len(verdicts)} receipt(s): {len(verdicts) - len(bad)} match, {len(bad)} mismatch "
         f"({llm.engine.device_name}, {llm.engine.threads} thread{'' if llm.engine.threads == 1 else 's'})")
    if bad:
        sys.exit(1)
