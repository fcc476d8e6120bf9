"""Batch jobs: ``intdet batch`` (cli/batch.py) and its Python side.

    from intdet.batch import run_job, BatchPredictor
    summary = run_job("items.jsonl", "out.jsonl", model=None, task="generate", engine="local", workers=2)

items.py (the JSONL item schema), tasks.py (generate, score, perplexity:
records with exact integer results), output.py (the resumable output
file and corpus totals), local.py (in-process and worker processes),
ray_engine.py (Ray Data map_batches; ``BatchPredictor`` for your own
Dataset), dask_engine.py (a worker plugin per worker), runner.py (the driver).
"""

from .items import TASKS
from .output import summarize
from .runner import ENGINES, run_job

__all__ = ["TASKS", "ENGINES", "run_job", "summarize", "BatchPredictor"]


def __getattr__(name):
    if name == "BatchPredictor":  # ray_engine imports nothing of Ray until used
        from .ray_engine import BatchPredictor

        return BatchPredictor
    raise AttributeError(name)
