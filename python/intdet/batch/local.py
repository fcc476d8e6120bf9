"""``--engine local``: the items on this machine, in this process
(``workers`` 0) or in worker processes that each load the model once
(concurrent.futures, spawn start method: no OpenMP or engine state crosses a
fork) and run the batches sent to them.

An engine is a function ``(config, batches) -> iterator of [(pos, record)]``:
``batches`` is a list of [(pos, Item)] and each yielded list holds one
batch's records, in any order of batches.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass

from .items import Item
from .tasks import TaskRunner


@dataclass
class WorkerConfig:
    """What every worker needs to load the model: a converted model
    directory (resolved once by the driver), the device, CPU threads per
    worker (0 = all cores) and the scheduler's batch limit."""

    model: str
    device: str = "cpu"
    threads: int = 0
    max_batch: int = 16

    def runner(self) -> TaskRunner:
        return TaskRunner(self.model, self.device, self.threads, self.max_batch)


def run_serial(cfg: WorkerConfig, batches):
    runner = cfg.runner()
    for b in batches:
        recs = runner.run([it for _, it in b])
        yield [(pos, r) for (pos, _), r in zip(b, recs)]


_runner = None


def _exit_with_parent(parent: int) -> None:
    """A worker whose driver died (kill -9) exits instead of lingering."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def _init(cfg: WorkerConfig, parent: int) -> None:
    global _runner
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    _runner = cfg.runner()


def _run(batch: list) -> list:
    """One batch in a worker process: [(pos, item JSON)] -> [(pos, record)]."""
    items = [Item.from_json(s) for _, s in batch]
    return [(pos, r) for (pos, _), r in zip(batch, _runner.run(items))]


def run_pool(cfg: WorkerConfig, batches, workers: int):
    """The batches on ``workers`` processes; at most 2 batches per worker in
    flight, so a killed job has little work started and not written."""
    if workers <= 0:
        yield from run_serial(cfg, batches)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init, initargs=(cfg, os.getpid())) as ex:
        todo = iter(batches)
        running = set()
        try:
            while True:
                while len(running) < 2 * workers:
                    b = next(todo, None)
                    if b is None:
                        break
                    running.add(ex.submit(_run, [(pos, it.to_json()) for pos, it in b]))
                if not running:
                    return
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    yield fut.result()
        finally:
            for fut in running:
                fut.cancel()
