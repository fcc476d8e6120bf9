"""Test hook: a process sends itself a signal at a named point of its work.

Inert unless the environment variable ``INTDET_TEST_SIGNAL_AT`` is set. Tests
set it to ``STAGE`` or ``STAGE:SIGNAL`` (a name such as ``SIGTERM``; default
``SIGINT``) so that an interrupt lands at a known point instead of after a
guessed delay, which a faster or slower machine would move. Stages:

* convert: ``read`` (source read), ``quantize`` (halfway through the tensors),
  ``written`` (model.safetensors written into the temporary directory),
  ``install`` (just before the final rename), ``installed`` (just after it);
* generate: ``prefill-N`` (the N-th prefill call returned; calls are of
  generate.PREFILL_CHUNK tokens), ``token-N`` (the N-th generated token
  chosen and streamed);
* batch: ``batch-record-N`` (the driver wrote its N-th record).

``INTDET_TEST_STALL_AT`` names a stage where the process instead sleeps for
an hour (a worker busy with a batch when its job is stopped): batch
``batch-worker-N`` (a worker process starting its N-th batch); scheduler
``engine-step-N`` (the engine loop's N-th forward call, before it runs: a
step that outlasts the server's drain).
"""

from __future__ import annotations

import os
import signal
import time

ENV = "INTDET_TEST_SIGNAL_AT"
STALL_ENV = "INTDET_TEST_STALL_AT"


def _armed() -> tuple[str, str]:
    stage, _, sig = os.environ.get(ENV, "").partition(":")
    return stage, sig or "SIGINT"


def signal_at(stage: str) -> None:
    """Send this process the configured signal if ``stage`` is the one named
    in $INTDET_TEST_SIGNAL_AT; otherwise do nothing. Python runs the signal's
    handler as soon as os.kill returns, so what it raises comes from here."""
    want, sig = _armed()
    if want == stage:
        os.kill(os.getpid(), signal.Signals[sig])


def watch_quantize(plan) -> None:
    """Arm the ``quantize`` stage on convert's quantize.Plan ``plan`` (just
    before its middle job: halfway through writing the tensors) when the
    hook names it; otherwise leave plan untouched."""
    if _armed()[0] == "quantize" and plan.jobs:
        mid = len(plan.jobs) // 2
        job = plan.jobs[mid]

        def signalled(put, job=job):
            signal_at("quantize")
            job(put)

        plan.jobs[mid] = signalled


def stall_at(stage: str) -> None:
    """Sleep an hour if ``stage`` is the one named in $INTDET_TEST_STALL_AT."""
    if os.environ.get(STALL_ENV) == stage:
        time.sleep(3600)
