"""A rollout pool on Ray for RL loops: N actors each holding an ``LLM`` of
one model; ``generate`` spreads a batch of GRPO groups (n samples per
prompt) over them, ``update_weights`` puts new weights in Ray's object
store once and every actor swaps them in.

Results are those of one process whatever the number of actors: every
sample is one request whose tokens, log-probabilities and chain hash do not
depend on what it is batched with (the scheduler's batch invariance), and
sample i of a prompt seeded s draws with ``derive_seed(s, i)`` wherever it
runs. Every Completion names the ``model_version`` it ran on.

    pool = RolloutPool(model_dir, workers=4)
    groups = pool.generate(prompts, SamplingParams(temperature=1, max_tokens=256, seed=7), n=8)
    version = pool.update_weights(trainer.state_dict())   # HF names, torch or numpy
    pool.close()

Needs the ray extra (``pip install 'intdet[ray]'``); ``address`` joins a
running cluster, else a local one is started (and stopped by ``close``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence, Union

from .api import Completion, SamplingParams, derive_seed
from .errors import IntdetError


class _Worker:
    """One Ray actor: an LLM and the calls the pool makes on it."""

    def __init__(self, model, llm_kwargs: dict):
        from .api import LLM

        self.llm = LLM(model, **llm_kwargs)

    def model_version(self) -> str:
        return self.llm.model_version

    def generate(self, prompts: list, params: list) -> list:
        return self.llm.generate(prompts, params) if prompts else []

    def update_weights(self, weights) -> str:
        return self.llm.update_weights(weights)


class RolloutPool:
    """``workers`` Ray actors with an LLM of ``model`` each (``llm_kwargs``
    as LLM takes them: device, threads, weights, max_batch...; threads
    defaults to 1 per actor). IntdetError when Ray is missing or an actor
    cannot load the model (its message)."""

    def __init__(self, model=None, workers: int = 2, address: Union[str, None] = None, **llm_kwargs):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise IntdetError(f"workers: {workers!r} must be an integer >= 1", field="workers")
        try:
            import ray
        except ImportError:
            raise IntdetError("RolloutPool needs the ray extra: pip install 'intdet[ray]'") from None
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            import logging
            import signal

            # ray.init installs SIGINT/SIGTERM handlers in the driver: close() puts the caller's back
            self._handlers = [(s, signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)]
            if address:
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
            else:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                         logging_level=logging.WARNING)
            self._started = True
        llm_kwargs.setdefault("threads", 1)
        actor = ray.remote(num_cpus=1)(_Worker)
        self._actors = [actor.remote(model, llm_kwargs) for _ in range(workers)]
        try:
            versions = set(self._get([a.model_version.remote() for a in self._actors]))
        except IntdetError:
            self.close()
            raise
        if len(versions) != 1:
            self.close()
            raise IntdetError(f"model: the actors loaded different models ({sorted(versions)})", field="model")
        self.model_version = versions.pop()

    @property
    def workers(self) -> int:
        return len(self._actors)

    def _get(self, refs):
        """Every ref's result, each one read (an error left unread is logged
        by Ray with a traceback); the first error raised after all."""
        out, first = [], None
        for ref in refs:
            try:
                out.append(self._ray.get(ref))
            except self._ray.exceptions.RayTaskError as e:
                first = first or e
        if first is not None:
            cause = getattr(first, "cause", None)
            if isinstance(cause, IntdetError):
                raise IntdetError(str(cause), field=cause.field) from None
            raise first
        return out

    def generate(self, prompts: Sequence, params: Union[SamplingParams, None] = None, n: int = 1) -> list:
        """[[Completion] * n per prompt]: n samples of each prompt (a str or
        a list of token ids), sample i seeded ``derive_seed(params.seed, i)``
        (the same inputs give the same groups). The samples are spread over the actors in
        contiguous shares; the result is the same with any number of them."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise IntdetError(f"n: {n!r} must be an integer >= 1", field="n")
        params = params or SamplingParams()
        prompts = list(prompts)
        jobs = [(p, dataclasses.replace(params, seed=derive_seed(params.seed, i)))
                for p in prompts for i in range(n)]
        k = len(self._actors)
        share = -(-len(jobs) // k) if jobs else 0
        parts = [jobs[w * share:(w + 1) * share] for w in range(k)]
        refs = [a.generate.remote([p for p, _ in part], [sp for _, sp in part])
                for a, part in zip(self._actors, parts)]
        flat: list = [c for out in self._get(refs) for c in out]
        return [flat[i * n:(i + 1) * n] for i in range(len(prompts))]

    def update_weights(self, weights) -> str:
        """Every actor swaps in ``weights`` (LLM.update_weights' forms; read
        here once, into Ray's object store once); returns the new
        model_version. IntdetError naming the tensor for a bad one (every
        actor keeps its weights: each refuses before it swaps)."""
        from .update import read_weights

        w = weights if isinstance(weights, (str, os.PathLike)) else read_weights(weights)
        ref = self._ray.put(w)
        versions = set(self._get([a.update_weights.remote(ref) for a in self._actors]))
        if len(versions) != 1:
            raise IntdetError(f"internal: the actors hold different weights after the update ({sorted(versions)})")
        self.model_version = versions.pop()
        return self.model_version

    def close(self) -> None:
        """Stop the actors (and the local Ray this pool started)."""
        for a in getattr(self, "_actors", []):
            try:
                self._ray.kill(a)
            except Exception:  # noqa: BLE001  (already gone)
                pass
        self._actors = []
        if self._started:
            import signal

            self._ray.shutdown()
            self._started = False
            for sig, h in self._handlers:
                if h is not None:
                    try:
                        signal.signal(sig, h)
                    except ValueError:  # not the main thread: nothing to restore from here
                        break

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["RolloutPool", "Completion"]
