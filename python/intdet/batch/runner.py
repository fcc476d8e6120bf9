"""The driver of ``intdet batch``: read the items, skip those the output
already holds, cut the rest into batches, run them on an engine and write
the records (output.py), then total the whole output file."""

from __future__ import annotations

import contextlib
import os
import sys

from .. import backends
from ..errors import IntdetError
from .items import TASKS, parse_line
from .local import WorkerConfig, run_pool
from .output import Reorder, open_output, summarize
from .tasks import default_threads, error_record

ENGINES = ("local", "ray", "dask")
INPUT_LIMIT = 8 << 30  # bytes of input read into memory at most


def read_items(path: str, task: str) -> list:
    """Parsed items of the JSONL file ``path`` (blank lines skipped)."""
    if not os.path.isfile(path):
        raise IntdetError(f"{path}: no such file")
    size = os.path.getsize(path)
    if size > INPUT_LIMIT:
        raise IntdetError(f"{path}: {size} bytes, more than the {INPUT_LIMIT} an input may hold")
    items, seen = [], {}
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            if i == 0 and line.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark (some editors write one)
                line = line[3:]
            it = parse_line(i, line.rstrip(b"\r\n"), task, seen)
            if it is not None:
                items.append(it)
    return items


def run_job(input_path: str, output_path: str, model=None, task: str = "generate", engine: str = "local",
            workers: int = 1, address=None, batch_size: int = 16, threads=None, device: str = "cpu",
            unordered: bool = False, progress: bool = False, revision=None, weights=None, notice=None,
            prefix_cache: bool = False, receipts: bool = False) -> dict:
    """Run the items of ``input_path`` into ``output_path`` (resuming it) and
    return output.summarize of the finished file. ``workers`` 0 with the
    local engine runs in this process. ``threads``: CPU threads per worker
    (None: the cores shared out among local workers, 1 per Ray/Dask worker).
    ``notice(msg)``: told when the model is converted into the cache.
    ``prefix_cache``: each worker's scheduler keeps a prefix cache (a batch
    of items sharing a few-shot header prefills it once; the records are
    the same bits either way). ``receipts``: every generate record's result
    carries its receipt (``intdet verify`` replays them).
    Raises IntdetError for a bad argument, file or model."""
    from tqdm import tqdm

    from ..resolve import resolve_model
    from ..testhook import signal_at

    if task not in TASKS:
        raise IntdetError(f"task: {task!r}: choose {', '.join(TASKS)}", field="task")
    if engine not in ENGINES:
        raise IntdetError(f"engine: {engine!r}: choose {', '.join(ENGINES)}", field="engine")
    if workers < 0 or engine != "local" and workers < 1:
        raise IntdetError(f"workers: {workers} must be >= {0 if engine == 'local' else 1}", field="workers")
    if batch_size < 1:
        raise IntdetError(f"batch_size: {batch_size} must be >= 1", field="batch_size")
    if address and engine == "local":
        raise IntdetError("address: only with the ray or dask engine", field="address")
    if engine == "local":  # the workers run here: a device that cannot is one line now, not a dead worker
        why = backends.availability(device)
        if why:
            raise IntdetError(why, field="device")
    else:  # the cluster's nodes decide what runs there; the name must still be a backend's
        backends.spec(device)
    if os.path.exists(output_path) and os.path.exists(input_path) and os.path.samefile(input_path, output_path):
        raise IntdetError(f"output_path {output_path}: is the input file", field="output_path")
    items = read_items(input_path, task)
    if engine == "ray":
        from .ray_engine import require_ray as require
    elif engine == "dask":
        from .dask_engine import require_dask as require
    if engine != "local":
        require()  # a missing extra is an error before the output file is touched
    created = not os.path.lexists(output_path)
    f, done = open_output(output_path)
    ok = False
    try:
        foreign = done.keys() - {it.key for it in items}
        if foreign:  # resuming would mix another input's results into this one's
            raise IntdetError(f"-o {output_path}: holds {len(foreign)} record(s) whose ids are not in {input_path} "
                              f"(e.g. {sorted(foreign)[0]}): the output of another input? Give another -o")
        changed = [it for it in items if done.get(it.key) is not None and done[it.key] != it.digest()]
        if changed:  # the record was made from another version of this line
            it = changed[0]
            raise IntdetError(f"-o {output_path}: the record of {it.key} was made from a different item than line "
                              f"{it.index + 1} of {input_path} now holds ({len(changed)} such record(s)): the input "
                              "changed since? Give another -o, or remove those records to rerun them")
        todo = [it for it in items if it.key not in done]
        if threads is None:
            threads = default_threads(workers) if engine == "local" else 1
        bar = tqdm(total=len(todo), unit="item", desc="intdet batch", disable=not progress, file=sys.stderr)

        def on_write(n):
            bar.update(1)
            signal_at(f"batch-record-{n}")

        writer = Reorder(f, ordered=not unordered, on_write=on_write)
        batches, cur = [], []
        for pos, it in enumerate(todo):
            if it.error:
                writer.put(pos, error_record(it, it.error))
                continue
            cur.append((pos, it))
            if len(cur) == batch_size:
                batches.append(cur)
                cur = []
        if cur:
            batches.append(cur)
        if batches:
            if address:  # the nodes of a cluster resolve (and convert) the model themselves
                cfg = WorkerConfig(model, device, threads, batch_size, revision, weights, prefix_cache, receipts)
            else:  # converted once here; every worker loads the converted directory
                path = resolve_model(model, revision, progress=progress, weights=weights, notice=notice)
                cfg = WorkerConfig(path, device, threads, batch_size, prefix_cache=prefix_cache, receipts=receipts)
            if engine == "local":
                results = run_pool(cfg, batches, workers)
            elif engine == "ray":
                from .ray_engine import run_ray

                results = run_ray(cfg, batches, workers, address, batch_size)
            else:
                from .dask_engine import run_dask

                results = run_dask(cfg, batches, workers, address)
            for recs in results:
                for pos, rec in recs:
                    writer.put(pos, rec)
        writer.close()
        bar.close()
        ok = True
    finally:
        if not f.closed:
            f.close()
        if not ok and created:  # stopped before any record (a model or engine error): leave nothing behind
            with contextlib.suppress(OSError):
                if os.path.getsize(output_path) == 0:
                    os.unlink(output_path)
    return summarize(output_path)
