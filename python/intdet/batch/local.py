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
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from ..errors import IntdetError
from ..testhook import stall_at
from .items import Item
from .tasks import TaskRunner


@dataclass
class WorkerConfig:
    """What every worker needs to load the model: the model (on this
    machine, the converted directory the driver resolved once; on a cluster
    the source as given, resolved on each node), the device, CPU threads per
    worker (0 = all cores), the scheduler's batch limit, revision and
    weights for a model that needs converting, whether the scheduler
    keeps a prefix cache (items sharing a prompt's start: few-shot evals),
    and whether generate records carry a receipt (receipts.py)."""

    model: object
    device: str = "cpu"
    threads: int = 0
    max_batch: int = 16
    revision: object = None
    weights: object = None
    prefix_cache: bool = False
    receipts: bool = False

    def runner(self) -> TaskRunner:
        return TaskRunner(self.model, self.device, self.threads, self.max_batch, self.revision, self.weights,
                          self.prefix_cache, self.receipts)


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
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's: it stops the job
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    _runner = cfg.runner()


_batches = 0  # batches this worker process has started


def _run(batch: list) -> list:
    """One batch in a worker process: [(pos, item JSON)] -> [(pos, record)]."""
    global _batches
    _batches += 1
    stall_at(f"batch-worker-{_batches}")  # test hook (testhook.py), inert unless its variable is set
    items = [Item.from_json(s) for _, s in batch]
    return [(pos, r) for (pos, _), r in zip(batch, _runner.run(items))]


def run_pool(cfg: WorkerConfig, batches, workers: int):
    """The batches on ``workers`` processes; at most 2 batches per worker in
    flight, so a killed job has little work started and not written."""
    if workers <= 0:
        yield from run_serial(cfg, batches)
        return
    ctx = multiprocessing.get_context("spawn")
    ex = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init, initargs=(cfg, os.getpid()))
    todo = iter(batches)
    running = set()
    done = False
    try:
        while True:
            while len(running) < 2 * workers:
                b = next(todo, None)
                if b is None:
                    break
                running.add(ex.submit(_run, [(pos, it.to_json()) for pos, it in b]))
            if not running:
                done = True
                return
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                try:
                    res = fut.result()
                except BrokenProcessPool:
                    raise IntdetError("a worker process died (out of memory, or killed); "
                                      "rerun the same command to resume") from None
                yield res
    finally:
        if not done:
            # stopped early (Ctrl-C, an error): the batches in flight will not be
            # written (a rerun resumes them), so stop their workers now.
            # shutdown(wait=False) alone could leave the interpreter's exit
            # joining a worker that never got its sentinel: a hang.
            _stop_workers(ex)
        ex.shutdown(wait=True, cancel_futures=True)


def _stop_workers(ex: ProcessPoolExecutor) -> None:
    """Terminate the pool's worker processes (ProcessPoolExecutor.terminate_workers
    from Python 3.14; before it, the processes the executor holds)."""
    stop = getattr(ex, "terminate_workers", None)
    if stop is not None:
        stop()
        return
    for p in list((getattr(ex, "_processes", None) or {}).values()):
        p.terminate()
