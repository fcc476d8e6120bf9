"""The output file of ``intdet batch``: JSONL, appended one whole record at
a time, resumable.

A record line is written with one ``write`` of the full line and its
newline, then flushed (and fsync'ed every ``fsync_every`` records and at the
end), so a crash leaves at most an incomplete last line: ``open_output``
cuts such a tail off before appending. Rerunning with the same output reads
the record keys already there (items.record_key) and the job skips those
items. ``Reorder`` writes records in input order (or as they come, when
unordered): in order, the records done when a job is killed are a prefix of
the input's, so a resumed job writes the same file as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os

from ..errors import IntdetError
from .items import record_key
from .tasks import record_line

Q24 = 1 << 24


def _lock(f, path: str) -> None:
    """An exclusive advisory lock on the open output for the job's life (it
    goes with the file's closing): two jobs appending to one file would
    write every record twice. No-op where fcntl is missing (Windows)."""
    try:
        import fcntl
    except ImportError:
        return
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise IntdetError(f"-o {path}: another intdet batch is writing it (wait for it to end, or give another "
                          "file)") from None


def open_output(path: str):
    """Open ``path`` for appending, locked (``_lock``); return (file, {done
    record key: its item_sha256, or None in a record written before records
    carried it}). A last line without its newline (a crash mid-write) is cut
    off; a complete line that is not a record is an error naming the line."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise IntdetError(f"-o {path}: directory {d} does not exist")
    done = {}
    f = open(path, "a+b")
    try:
        _lock(f, path)
        f.seek(0)
        data = f.read()
        end = data.rfind(b"\n") + 1
        for n, line in enumerate(data[:end].splitlines(), 1):
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict) or not {"id", "task", "result", "error"} <= rec.keys():
                    raise ValueError
                done[record_key(rec)] = rec.get("item_sha256")
            except (ValueError, KeyError, TypeError, AttributeError):
                raise IntdetError(f"{path}: line {n} is not an intdet batch record; "
                                  "give a new output file or remove it") from None
        if end < len(data):
            f.truncate(end)
    except BaseException:
        f.close()
        raise
    return f, done


class Reorder:
    """Write records keyed by their position in the to-do list: in that
    order (``ordered``), holding back those that come early, or at once."""

    def __init__(self, f, ordered: bool = True, fsync_every: int = 256, on_write=None):
        self.f, self.ordered, self.fsync_every = f, ordered, fsync_every
        self.next, self.held, self.written = 0, {}, 0
        self.on_write = on_write

    def put(self, pos: int, rec: dict) -> None:
        if not self.ordered:
            self._write(rec)
            return
        self.held[pos] = rec
        while self.next in self.held:
            self._write(self.held.pop(self.next))
            self.next += 1

    def _write(self, rec: dict) -> None:
        self.f.write((record_line(rec) + "\n").encode("utf-8"))
        self.f.flush()
        self.written += 1
        if self.written % self.fsync_every == 0:
            os.fsync(self.f.fileno())
        if self.on_write:
            self.on_write(self.written)

    def close(self) -> None:
        if self.held:
            raise RuntimeError(f"{len(self.held)} records still held back")
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()


def summarize(path: str) -> dict:
    """Totals over every record of the output file ``path``: items, errors,
    per task counts; generate: generated tokens; score: the sum of
    logprob_q; compress: bytes and compressed_bytes (bits_per_byte from
    them); perplexity: nll_q, tokens, bytes (integers) and, from them
    once, nll (nats/token), perplexity = exp(nll) and bits_per_byte (floats
    of the integer totals, so the same whatever the split)."""
    tot = {"items": 0, "errors": 0, "tasks": {}}
    ppl = {"nll_q": 0, "tokens": 0, "bytes": 0}
    cz = {"bytes": 0, "compressed_bytes": 0}
    gen_tokens, score_q = 0, 0
    with open(path, "rb") as f:
        for line in f:
            rec = json.loads(line)
            tot["items"] += 1
            task = rec.get("task") or "none"
            tot["tasks"][task] = tot["tasks"].get(task, 0) + 1
            if rec.get("error") is not None:
                tot["errors"] += 1
                continue
            r = rec["result"]
            if task == "generate":
                gen_tokens += len(r["tokens"])
            elif task == "score":
                score_q += r["logprob_q"]
            elif task == "perplexity":
                for k in ppl:
                    ppl[k] += r[k]
            elif task == "compress":
                for k in cz:
                    cz[k] += r[k]
    tot["generate"] = {"tokens": gen_tokens}
    tot["score"] = {"logprob_q": score_q}
    if ppl["tokens"]:
        nll = ppl["nll_q"] / Q24 / ppl["tokens"]
        ppl.update(nll=nll, perplexity=math.exp(nll),
                   bits_per_byte=ppl["nll_q"] / Q24 / math.log(2) / max(ppl["bytes"], 1))
    tot["perplexity"] = ppl
    if cz["bytes"]:
        cz["bits_per_byte"] = 8 * cz["compressed_bytes"] / cz["bytes"]
    tot["compress"] = cz
    return tot
