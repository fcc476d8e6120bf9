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
    """Raised in the main thread by SIGTERM (or, where asked, SIGHUP) inside
    :func:`sigterm_raises`; ``signum`` names it. A BaseException, like
    KeyboardInterrupt, so ``except Exception`` does not swallow it. The CLI
    reports it in one line and exits 128 + signum (143 for SIGTERM)."""

    def __init__(self, msg: str = "terminated", signum: int = signal.SIGTERM):
        super().__init__(msg)
        self.signum = int(signum)


def _raise_terminated(signum, frame):
    raise Terminated("terminated" if signum == signal.SIGTERM else "hung up", signum)


@contextlib.contextmanager
def sigterm_raises(hangup: bool = False):
    """Within the block, SIGTERM (and SIGHUP with ``hangup``: the terminal
    closed) raises Terminated in the main thread.

    Does nothing for a signal the program already handles itself, nor off
    the main thread (Python runs signal handlers only there); the previous
    handlers are restored on leaving the block."""
    sigs = [signal.SIGTERM] + ([signal.SIGHUP] if hangup and hasattr(signal, "SIGHUP") else [])
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mine = [s for s in sigs if signal.getsignal(s) == signal.SIG_DFL]
    for s in mine:
        signal.signal(s, _raise_terminated)
    try:
        yield
    finally:
        for s in mine:
            signal.signal(s, signal.SIG_DFL)


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
