"""Where ``intdet convert`` may write, and how it replaces an old model.

``--force`` replaces only an intdet model directory (config.json saying
``"format": "intdet"`` and no file that ``intdet convert`` does not write) or
an empty directory, never anything else and never a directory holding the
source. The new model is built in a temporary sibling directory and swapped
in by one rename (Linux ``renameat2(RENAME_EXCHANGE)``; elsewhere two renames
with SIGINT/SIGTERM deferred between them), so an interruption at any instant
leaves the old model or the new one at OUT, never neither (a Ctrl-C
between them is deferred until both are done).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import signal

from ..errors import IntdetError
from ..format import MODEL_FILES, is_converted

TMP_PREFIX = ".intdet-convert-"


def check_output(out_dir: str, src: str, force: bool) -> None:
    """Raise IntdetError, before any work, unless ``out_dir`` may receive the
    model converted from ``src``: absent, an empty directory, or (with
    force) an intdet model directory holding only the files convert writes
    and not holding src."""
    if os.path.islink(out_dir):
        raise IntdetError(f"{out_dir}: output is a symbolic link (give the directory it points to)")
    if not os.path.lexists(out_dir):
        return
    if not os.path.isdir(out_dir):
        raise IntdetError(f"{out_dir}: output exists and is not a directory (--force replaces only an intdet model directory)")
    real_out, real_src = os.path.realpath(out_dir), os.path.realpath(src)
    if real_src == real_out or real_src.startswith(real_out.rstrip(os.sep) + os.sep):
        raise IntdetError(f"{out_dir}: output holds the source {src}; choose another output directory")
    entries = os.listdir(out_dir)
    if not entries:
        return
    if not force:
        raise IntdetError(f"{out_dir}: output exists and is not empty (--force replaces an intdet model directory)")
    if not is_converted(out_dir):
        raise IntdetError(f"{out_dir}: not an intdet model directory; --force replaces only a converted model "
                          f"or an empty directory")
    foreign = sorted(set(entries) - MODEL_FILES)
    if foreign:
        raise IntdetError(f"{out_dir}: holds '{foreign[0]}', which intdet convert did not write; --force replaces "
                          f"only a converted model directory")


def _renameat2_exchange():
    """libc renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) as a function
    (a, b) -> errno (0 on success), or None where libc has no renameat2."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    AT_FDCWD, RENAME_EXCHANGE = -100, 2

    def exchange(a: str, b: str) -> int:
        return 0 if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0 else ctypes.get_errno()

    return exchange


def install(tmp: str, out_dir: str, src: str, force: bool) -> None:
    """Move the finished model directory ``tmp`` to ``out_dir`` (checked again
    first: the conversion took a while). Afterwards the old model, if any,
    lies at ``tmp`` or ``old_path(tmp)``, for the caller to remove."""
    check_output(out_dir, src, force)
    if not os.path.lexists(out_dir) or not os.listdir(out_dir):
        os.replace(tmp, out_dir)  # rename(2) over an empty directory is atomic
        return
    exchange = _renameat2_exchange()
    err = exchange(tmp, out_dir) if exchange else errno.ENOSYS
    if err == 0:
        return  # tmp now holds the old model
    if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        raise OSError(err, os.strerror(err), out_dir)
    # No atomic exchange on this system or file system: park the old model
    # beside it, with the signals a user sends held off between the renames.
    old = old_path(tmp)
    with _signals_deferred():
        os.rename(out_dir, old)
        try:
            os.rename(tmp, out_dir)
        except BaseException:
            os.rename(old, out_dir)
            raise


class _signals_deferred:
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


def old_path(tmp: str) -> str:
    """Where install() parks the replaced model when it cannot swap atomically."""
    return tmp + "-old"


def remove_tree(path: str) -> None:
    """rmtree that a second Ctrl-C arriving during the cleanup cannot cut short."""
    for _ in range(5):
        try:
            shutil.rmtree(path, ignore_errors=True)
            return
        except KeyboardInterrupt:
            continue
