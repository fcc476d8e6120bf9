"""``--engine dask``: the batches as Dask tasks on a cluster whose workers
each load the model once, in a worker plugin (``ModelPlugin.setup``).

``--address`` connects to an existing scheduler (``tcp://host:8786``);
without it a ``LocalCluster`` of ``workers`` processes, one thread each, on
127.0.0.1 with no dashboard, is started for the job and closed after.
"""

from __future__ import annotations

from ..errors import IntdetError
from .items import Item
from .local import WorkerConfig

try:
    from distributed.diagnostics.plugin import WorkerPlugin
except ImportError:  # the dask extra is not installed: run_dask says so
    WorkerPlugin = object

PLUGIN = "intdet-model"


class ModelPlugin(WorkerPlugin):
    """A Dask worker plugin that loads the model once when a worker starts
    (or joins); tasks find it as ``get_worker().plugins["intdet-model"]``."""

    name = PLUGIN

    def __init__(self, cfg: WorkerConfig):
        self.cfg = cfg
        self.runner = None

    def setup(self, worker):
        self.runner = self.cfg.runner()


def _run(batch: list) -> list:
    """One batch on a worker: [(pos, item JSON)] -> [(pos, record)]."""
    from distributed import get_worker

    runner = get_worker().plugins[PLUGIN].runner
    items = [Item.from_json(s) for _, s in batch]
    return [(pos, r) for (pos, _), r in zip(batch, runner.run(items))]


def require_dask():
    """IntdetError saying which extra to install when distributed is missing."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise IntdetError("engine dask needs the dask extra: pip install 'intdet[dask]'", field="engine") from None


def run_dask(cfg: WorkerConfig, batches, workers: int, address=None):
    require_dask()
    from distributed import Client, LocalCluster, as_completed
    cluster = None
    if address:
        try:
            client = Client(address)
        except (OSError, TimeoutError, ValueError) as e:  # refused, timed out, a malformed address
            raise IntdetError(f"address {address}: cannot reach a Dask scheduler there ({e})", field="address") from None
    else:
        cluster = LocalCluster(n_workers=max(1, workers), threads_per_worker=1, processes=True,
                               dashboard_address=None, host="127.0.0.1")
        client = Client(cluster)
    try:
        client.register_plugin(ModelPlugin(cfg), name=PLUGIN)
        todo = iter(batches)
        n_workers = max(1, len(client.scheduler_info().get("workers", {})) or workers)
        running = as_completed()
        for _ in range(2 * n_workers):
            b = next(todo, None)
            if b is None:
                break
            running.add(client.submit(_run, [(pos, it.to_json()) for pos, it in b], pure=False))
        for fut in running:
            yield fut.result()
            b = next(todo, None)
            if b is not None:
                running.add(client.submit(_run, [(pos, it.to_json()) for pos, it in b], pure=False))
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
