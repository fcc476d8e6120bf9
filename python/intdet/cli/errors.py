"""The CLI's error convention.

Every error, a bad option value or usage included, prints one line,
``intdet: error: ...``, and exits 1; no traceback, no partial output.
Warnings (contradictory but harmless options) print ``intdet: warning: ...``.
Ctrl-C exits 130: during generation after printing the text so far and its
hash, elsewhere with the one line ``intdet: interrupted``. SIGTERM during a
conversion exits 143 with the line ``intdet: terminated``. A closed or broken
stdout (``>&-``, ``| head -c1``) exits 1 without a traceback; with stderr
closed the work still runs and its stdout is whole, but the exit status is 1
when a line meant for stderr (stats, hash, an error) could not be shown.
"""

from __future__ import annotations

import functools
import os
import sys

import click

from ..errors import IntdetError
from ..signals import Terminated

_STREAMS = {"stdout_closed": False, "stderr_closed": False, "stderr_lost": False}


def _err(msg: str) -> None:
    """One line to stderr; remembered as lost when stderr is closed."""
    if _STREAMS["stderr_closed"]:
        _STREAMS["stderr_lost"] = True
        return
    try:
        click.echo(msg, err=True)
    except OSError:
        _STREAMS["stderr_lost"] = True


def _warn(msg: str) -> None:
    _err(f"intdet: warning: {msg}")


def _fail(msg: str, code: int = 1):
    _err(f"intdet: error: {msg}")
    sys.exit(code)


def _guard_std_streams() -> None:
    """Closed fds 0-2 (``>&-``) get /dev/null, so no file opened later takes
    their number and no write raises; which ones were closed is remembered."""
    for fd, name in ((0, None), (1, "stdout_closed"), (2, "stderr_closed")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if name:
            _STREAMS[name] = True
    if _STREAMS["stdout_closed"] or sys.stdout is None:
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    if _STREAMS["stderr_closed"] or sys.stderr is None:
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)


def _need_stdout() -> None:
    if _STREAMS["stdout_closed"]:
        raise IntdetError("standard output is closed (this command prints its result there)")


def _broken_pipe():
    """stdout's reader went away (``| head -c1``): stop quietly, exit 1, and
    point fd 1 at /dev/null so the interpreter's final flush cannot fail."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    except OSError:
        pass
    sys.exit(1)


# The option that gives each library field (IntdetError.field): the one place
# where the library's names meet the CLI's spellings.
OPTIONS = {
    "model": "-m", "revision": "--revision", "weights": "--weights", "device": "--device", "threads": "--threads",
    "draft_model": "--spec-draft", "max_tokens": "-n", "temperature": "--temperature", "top_p": "--top-p",
    "top_k": "--top-k", "min_p": "--min-p", "repeat_penalty": "--repeat-penalty", "repeat_last_n": "--repeat-last-n",
    "seed": "--seed", "truncate": "--truncate", "ids": "--ids", "ctx": "--ctx", "max_windows": "--max-windows",
    "batch": "--batch", "prompt_tokens": "--prompt-tokens", "gen_tokens": "--gen-tokens", "shape": "--shape",
    "task": "--task", "engine": "--engine", "workers": "--workers", "batch_size": "--batch-size",
    "address": "--address", "output_path": "-o",
}


def option_message(e: IntdetError) -> str:
    """``e``'s message with its leading field name spelled as the CLI option
    that gives it ("top_p: 2 is outside (0, 1]" -> "--top-p: 2 is outside
    (0, 1]"); other messages as they are."""
    msg, field = str(e), e.field
    opt = OPTIONS.get(field) if field else None
    if opt and (msg == field or msg.startswith((field + ":", field + " "))):
        return opt + msg[len(field):]
    return msg


def user_errors(fn):
    """Turn IntdetError (and errors from bad model files) into one-line exits."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except IntdetError as e:
            _fail(option_message(e))
        except BrokenPipeError:
            _broken_pipe()
        except KeyboardInterrupt:  # Ctrl-C outside generation (convert, model load): one line, exit 130
            _err("intdet: interrupted")
            sys.exit(130)
        except Terminated as e:  # SIGTERM (SIGHUP) during work that cleaned up first
            _err(f"intdet: {e}")
            sys.exit(128 + e.signum)
        except MemoryError:
            _fail("out of memory")
        except OSError as e:  # permission denied, disk full, ... on a named file
            where = f"{e.filename}: " if e.filename else ""
            _fail(f"{where}{e.strerror or e}")

    return wrapper


class IntdetGroup(click.Group):
    """click's group with intdet's error convention: a usage error (unknown
    option, bad value, missing argument) is one line ``intdet: error: ...``
    and exit 1, not click's usage block and exit 2."""

    def main(self, args=None, prog_name=None, **extra):
        _guard_std_streams()
        try:
            rv = super().main(args=args, prog_name=prog_name or "intdet", standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:
            click.echo(e.ctx.get_help())
            rv = 0
        except click.BadParameter as e:  # name the option first, as intdet's own errors do
            where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            name = "/".join(e.param.opts) if isinstance(e.param, click.Option) else (
                e.param.human_readable_name if e.param is not None else "")
            msg = " ".join(e.message.split())
            if isinstance(e, click.MissingParameter) or not msg:  # no message of its own: "Missing option '-o'."
                _fail(" ".join(e.format_message().split()) + where)
            _fail((f"{name}: {msg}" if name else " ".join(e.format_message().split())) + where)
        except click.UsageError as e:
            where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            _fail(" ".join(e.format_message().split()) + where)
        except click.ClickException as e:
            _fail(" ".join(e.format_message().split()))
        except click.exceptions.Abort:
            _err("intdet: interrupted")
            sys.exit(130)
        except BrokenPipeError:
            _broken_pipe()
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _broken_pipe()
        code = rv if isinstance(rv, int) else 0
        if _STREAMS["stderr_lost"] and code == 0:
            code = 1
        sys.exit(code)
