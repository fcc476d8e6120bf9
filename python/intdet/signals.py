"""SIGTERM as an exception, so that work which must clean up (a conversion's
temporary directory) gets to run its ``finally`` blocks; and a block that
SIGINT/SIGTERM must not cut in two (signals_deferred).

Python turns SIGINT into KeyboardInterrupt but leaves SIGTERM at the default
action, which ends the process on the spot: ``kill PID`` (or a service
manager, or a container runtime stopping) would leave files behind.
"""

from __future__ import annotations

import contextlib
import os
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


class signals_deferred:
    """SIGINT and SIGTERM that arrive inside the block act when it ends.

    Python runs signal handlers in the main thread whichever thread the OS
    delivered to, so a recording handler defers them for the whole process
    (a signal mask would not: OpenMP's threads keep theirs open). Off the
    main thread handlers cannot be changed, and none run there anyway."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.pending, self.old = [], {}
        try:
            for s in self.SIGNALS:
                self.old[s] = signal.signal(s, lambda sig, frame: self.pending.append(sig))
        except ValueError:  # not the main thread
            pass
        return self

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)
        for s in self.pending[:1]:  # now act on the first one as it would have
            h = self.old.get(s)
            if callable(h):
                h(s, None)  # e.g. default_int_handler: KeyboardInterrupt
            elif h != signal.SIG_IGN:
                os.kill(os.getpid(), s)
        return False
