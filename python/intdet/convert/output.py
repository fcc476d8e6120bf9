"""Where ``intdet convert`` may write, and how it replaces an old model.

``--force`` replaces only an intdet model directory (config.json saying
``"format": "intdet"`` and no file that ``intdet convert`` does not write) or
an empty directory, never anything else and never a directory holding the
source. The new model is built in a temporary sibling directory and swapped
in by one rename (Linux ``renameat2(RENAME_EXCHANGE)``; elsewhere two renames
with SIGINT/SIGTERM deferred between them), so an interruption at any instant
leaves the old model or the new one at OUT, never neither (a Ctrl-C
between them is deferred until both are done). A conversion killed
outright (SIGKILL) leaves its temporary directory, which the next
conversion into the same parent removes (sweep_stale).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import shutil

from ..errors import IntdetError
from ..format import MODEL_FILES, is_converted
from ..signals import Terminated, signals_deferred

TMP_PREFIX = ".intdet-convert-"
# A temporary directory of convert(), f"{TMP_PREFIX}{pid}-{8 hex digits}", or
# where install() parks the replaced model (old_path).
_TMP_NAME = re.compile(re.escape(TMP_PREFIX) + r"(\d+)-[0-9a-f]{8}(-old)?\Z")


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
    with signals_deferred():
        os.rename(out_dir, old)
        try:
            os.rename(tmp, out_dir)
        except BaseException:
            os.rename(old, out_dir)
            raise


def old_path(tmp: str) -> str:
    """Where install() parks the replaced model when it cannot swap atomically."""
    return tmp + "-old"


def remove_tree(path: str) -> None:
    """rmtree that a second Ctrl-C or SIGTERM arriving during the cleanup
    cannot cut short."""
    for _ in range(5):
        try:
            shutil.rmtree(path, ignore_errors=True)
            return
        except (KeyboardInterrupt, Terminated):
            continue


# --------------------------------------------------------- stale temporaries
# SIGKILL, a crash or a power cut leaves a conversion's temporary directory
# behind (SIGINT and SIGTERM are cleaned up). The next conversion into the
# same parent removes those whose process is gone. The PID alone is not
# proof: a cache shared by containers (other PID namespaces) holds
# directories of processes this one cannot see, so a live conversion also
# holds an flock on its directory (where the file system allows one), and a
# locked one is left alone.


def claim(tmp: str):
    """Lock the new temporary directory ``tmp`` for this process's lifetime
    (the kernel drops the lock when the process dies, however it dies).
    Returns a handle for release(), None where directories cannot be locked."""
    try:
        import fcntl

        fd = os.open(tmp, os.O_RDONLY)
    except (ImportError, OSError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def release(handle) -> None:
    """Drop the lock claim() took (None: nothing to drop)."""
    if handle is not None:
        os.close(handle)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # EPERM: alive, another user's; a pid out of range: not ours
        return True
    return True


def _locked(path: str) -> bool:
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY)
    except (ImportError, OSError):
        return False  # gone, or no flock here: the PID check decides
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def sweep_stale(parent: str) -> list:
    """Remove from ``parent`` the temporary directories (old_path ones too)
    of conversions whose process has died and that no process holds locked.
    Raises no OSError: this is housekeeping, and the conversion goes on
    whatever it finds. Returns the names removed."""
    if os.name == "nt":  # os.kill(pid, 0) there would send CTRL_C_EVENT
        return []
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for name in names:
        m = _TMP_NAME.match(name)
        path = os.path.join(parent, name)
        if not m or _pid_alive(int(m.group(1))) or os.path.islink(path) or not os.path.isdir(path):
            continue
        # A parked old model is locked through its conversion's own directory.
        if _locked(path[:-len("-old")] if m.group(2) else path):
            continue
        remove_tree(path)
        if not os.path.lexists(path):
            removed.append(name)
    return removed
