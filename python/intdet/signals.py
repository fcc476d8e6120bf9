"""SIGTERM as an exception, so that work which must clean up (a conversion's
temporary directory) gets to run its ``finally`` blocks.

Python turns SIGINT into KeyboardInterrupt but leaves SIGTERM at the default
action, which ends the process on the spot: ``kill PID`` (or a service
manager, or a container runtime stopping) would leave files behind.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class Terminated(BaseException):
    """Raised in the main thread by SIGTERM inside :func:`sigterm_raises`.
    A BaseException, like KeyboardInterrupt, so ``except Exception`` does not
    swallow it. The CLI reports it in one line and exits 143 (128 + 15)."""


def _raise_terminated(signum, frame):
    raise Terminated("terminated")


@contextlib.contextmanager
def sigterm_raises():
    """Within the block, SIGTERM raises Terminated in the main thread.

    Does nothing off the main thread (Python runs signal handlers only
    there) or when the program already handles SIGTERM itself; the previous
    handler is restored on leaving the block."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
