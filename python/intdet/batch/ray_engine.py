"""``--engine ray``: the job as a Ray Data ``map_batches`` stage over an
actor pool, each actor loading the model once (``BatchPredictor``).

``--address`` joins an existing cluster (``ray.init(address=...)``, e.g.
``auto`` or ``ray://head:10001``); without it Ray starts in local mode on
this machine with ``workers`` CPUs, no dashboard, usage stats and token
auth off (their environment variables, unless already set), a 200 MiB
object store and worker logs kept out of the terminal.

For a Ray Dataset of your own, pass ``BatchPredictor`` to ``map_batches``::

    import ray, intdet.batch
    ds = ray.data.read_json("items.jsonl")          # columns: id, prompt, max_tokens, ...
    out = ds.map_batches(intdet.batch.BatchPredictor, fn_constructor_kwargs={"model": "/models/smollm2"},
                         compute=ray.data.ActorPoolStrategy(size=4), num_cpus=1, batch_size=16)

Each output row is the input row's ``id`` plus ``record`` (the JSON line
``intdet batch`` writes for it) and ``error`` ("" when it worked). The model
path must exist on every node (or give a Hub repo id, converted on each).
"""

from __future__ import annotations

import json
import logging
import os
import signal

from ..errors import IntdetError
from .items import Item, id_key, parse_line
from .local import WorkerConfig
from .tasks import record_line

ITEM_COLUMN, POS_COLUMN = "_intdet_item", "_intdet_pos"


INT_FIELDS = ("max_tokens", "top_k", "repeat_last_n", "seed", "logprobs", "top", "ctx")


def _py(name, v):
    """A numpy/pyarrow cell as plain JSON-able Python (None stays None). An
    integer column with missing cells arrives as floats: an integral float
    of an integer field is that integer again."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, bytes):
        v = v.decode("utf-8")
    if name in INT_FIELDS and isinstance(v, float) and v.is_integer():
        v = int(v)
    if name == "id" and isinstance(v, float) and v.is_integer():
        v = int(v)
    return v


class BatchPredictor:
    """A Ray Data ``map_batches`` class: loads the model once per actor and
    runs each batch as ``intdet batch`` does (results bit-identical to it).

    Args: model (converted model dir, GGUF, HF dir or repo id; None = the
    default), task (the default task of rows without a ``task`` column),
    device, threads (per actor; 0 = all cores), max_batch, revision and
    weights (when the model needs converting), prefix_cache, receipts.
    ``__call__(batch)``: batch is a dict of columns (numpy arrays or lists);
    each row is an item (items.py; null cells are dropped). Returns columns
    ``id``, ``record`` (str) and ``error`` (str, "" when the item worked)."""

    def __init__(self, model=None, task: str = "generate", device: str = "cpu", threads: int = 1,
                 max_batch: int = 16, revision=None, weights=None, prefix_cache: bool = False, receipts: bool = False):
        self.task = task
        self.runner = WorkerConfig(model, device, threads, max_batch, revision, weights, prefix_cache,
                                   receipts).runner()

    def __call__(self, batch: dict) -> dict:
        cols = list(batch)
        n = len(batch[cols[0]]) if cols else 0
        if ITEM_COLUMN in batch:  # from the intdet batch driver: items already parsed
            items = [Item.from_json(s) for s in batch[ITEM_COLUMN]]
            recs = self.runner.run(items)
            return {POS_COLUMN: list(batch[POS_COLUMN]), "record": [record_line(r) for r in recs]}
        items, seen = [], {}
        for i in range(n):
            row = {c: _py(c, batch[c][i]) for c in cols}
            row = {k: v for k, v in row.items() if v is not None and not (isinstance(v, float) and v != v)}
            it = parse_line(i, json.dumps(row), self.task, seen)
            items.append(it)
            seen.pop(id_key(it.id), None)  # ids are the user's business across batches
        recs = self.runner.run(items)
        return {"id": [json.dumps(r["id"]) if not isinstance(r["id"], str) else r["id"] for r in recs],
                "record": [record_line(r) for r in recs], "error": [r["error"] or "" for r in recs]}


def require_ray():
    """The ray module, or IntdetError saying which extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401  (ray without [data] lacks it)
    except ImportError:
        raise IntdetError("engine ray needs the ray extra: pip install 'intdet[ray]'", field="engine") from None
    return ray


_SAVED_HANDLERS: list = []  # (signal, handler) before the ray.init this module made


def _init_ray(address, workers: int):
    ray = require_ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return ray, False
    quiet = dict(log_to_driver=False, logging_level=logging.WARNING)
    _SAVED_HANDLERS[:] = [(sig, signal.getsignal(sig)) for sig in (signal.SIGINT, signal.SIGTERM)]
    if address:
        ray.init(address=address, **quiet)
    else:
        ray.init(num_cpus=max(1, workers), include_dashboard=False, object_store_memory=200 << 20, **quiet)
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    return ray, True


def shutdown_ray(ray) -> None:
    """ray.shutdown() of a session _init_ray started, then the caller's
    SIGINT/SIGTERM handlers back (ray.init installs its own in the driver)."""
    ray.shutdown()
    for sig, h in _SAVED_HANDLERS:
        if h is not None:
            try:
                signal.signal(sig, h)
            except ValueError:  # not the main thread: nothing to restore from here
                break
    _SAVED_HANDLERS.clear()


def run_ray(cfg: WorkerConfig, batches, workers: int, address=None, batch_size: int = 16):
    ray, started = _init_ray(address, workers)
    try:
        import ray.data

        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        rows = [{POS_COLUMN: pos, ITEM_COLUMN: it.to_json()} for b in batches for pos, it in b]
        if not rows:
            return
        ds = ray.data.from_items(rows, override_num_blocks=max(1, min(len(rows) // batch_size, 4 * workers)))
        ds = ds.map_batches(BatchPredictor, batch_size=batch_size, batch_format="numpy",
                            compute=ray.data.ActorPoolStrategy(size=max(1, workers)), num_cpus=1,
                            fn_constructor_kwargs=dict(model=cfg.model, device=cfg.device, threads=cfg.threads or 1,
                                                       max_batch=cfg.max_batch, revision=cfg.revision,
                                                       weights=cfg.weights, prefix_cache=cfg.prefix_cache,
                                                       receipts=cfg.receipts))
        for b in ds.iter_batches(batch_size=batch_size, batch_format="numpy", prefetch_batches=1):
            yield [(int(p), json.loads(r)) for p, r in zip(b[POS_COLUMN], b["record"])]
    finally:
        if started:
            shutdown_ray(ray)
