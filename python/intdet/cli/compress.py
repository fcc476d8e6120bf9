"""``intdet compress`` / ``intdet decompress`` (docs/compress.md).

Every output goes to a temporary file beside it (stdout: in $TMPDIR) and is
renamed into place, or copied to stdout, only once complete and, for
decompress, checked against the header's sha256; an error, Ctrl-C, SIGTERM
or SIGHUP removes it. An existing output is replaced only with --force,
also when another run creates it meanwhile (the finished file is hard-linked
into place, which fails where a name exists). The output's free space is
checked before any work (decompress: the header's original size; compress:
at most its input's size and chunk records), and a failed write (a full
disk) is one line naming -o OUT, the temporary file removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import click

from ..errors import IntdetError
from ..signals import sigterm_raises
from .errors import _need_stdout, user_errors
from .options import MODEL_HELP_SHORT, _load, device_option, json_option, model_option, threads_option, weights_option

# compress's and decompress's own help texts (the bytes do not depend on the backend)
DEVICE_HELP = "Backend (the bytes are the same on each)."
THREADS_HELP = "CPU threads (default 0: auto, fewer while other processes keep cores busy; at most the cores)."
JSON_HELP = "Print sizes, bits per byte, tokens and times as JSON."


def _open_input(path: str):
    if path == "-":
        return contextlib.nullcontext(sys.stdin.buffer), "stdin", None
    if os.path.isdir(path):
        raise IntdetError(f"{path}: is a directory")
    try:
        f = open(path, "rb")
    except OSError as e:
        raise IntdetError(f"{path}: cannot read ({e.strerror})") from None
    size = os.fstat(f.fileno()).st_size
    return f, path, size


class _Sink:
    """The temporary output file as compress_stream / decompress_stream
    write it: an OSError (a full disk, a quota, EFBIG) becomes one
    IntdetError naming the output, not the temporary file."""

    def __init__(self, f, where: str):
        self._f, self._where = f, where

    def _call(self, fn, *a):
        try:
            return fn(*a)
        except OSError as e:
            raise _cannot_write(self._where, e) from None

    def write(self, b):
        return self._call(self._f.write, b)

    def seek(self, *a):
        return self._call(self._f.seek, *a)

    def tell(self):
        return self._call(self._f.tell)

    def flush(self):
        return self._call(self._f.flush)

    def fileno(self) -> int:
        return self._f.fileno()


def _cannot_write(where: str, e: OSError) -> IntdetError:
    return IntdetError(f"{where}: cannot write ({e.strerror or e})", field="output")


def _check_space(path: str, need: int | None, what: str, hint: str = "") -> None:
    """Refuse before any work when ``need`` bytes (None: unknown) cannot fit
    where the output's temporary file goes (``-``: $TMPDIR). The preflight
    checks' INTDET_SKIP_PREFLIGHT=1 skips it."""
    import tempfile

    from ..preflight import skipped, check_disk

    if need is None or skipped():
        return
    d = tempfile.gettempdir() if path == "-" else os.path.dirname(os.path.abspath(path))
    check_disk(need, d, f"-o {path}: {what}", hint=hint)


@contextlib.contextmanager
def _output(path: str, force: bool, inp: str = "-", need: int | None = None, need_what: str = "the output",
            need_hint: str = ""):
    """Yield a seekable binary temp file (a _Sink); on success it becomes
    ``path`` (``-``: is copied to stdout); on any error or signal it is
    removed. ``inp``: the input path, which the output may not replace.
    ``need``: bytes the output may take (``need_what`` says what they are,
    ``need_hint`` what to do if they do not fit), checked against the free
    space first. Raises IntdetError naming ``-o
    PATH`` for a bad path, too little space, or a failed write (full disk)."""
    import shutil
    import tempfile

    if not path:
        raise IntdetError("-o: empty path", field="output")
    if path != "-":
        if os.path.isdir(path):
            raise IntdetError(f"-o {path}: is a directory")
        if path.endswith(("/", os.sep)):
            raise IntdetError(f"-o {path}: names a directory, not a file")
        if inp != "-" and os.path.exists(path) and os.path.samefile(path, inp):
            raise IntdetError(f"-o {path}: is the input file (write the output elsewhere)")
        if os.path.lexists(path) and not force:
            raise IntdetError(f"-o {path}: exists (use --force to replace it)")
        d = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(d):
            raise IntdetError(f"-o {path}: directory {d} does not exist")
    _check_space(path, need, need_what, need_hint)
    where = f"-o {path}" if path != "-" else f"-o - (its temporary copy in {tempfile.gettempdir()})"
    with sigterm_raises(hangup=True):  # `kill` or a closed terminal cleans up as Ctrl-C does
        try:
            tmp = tempfile.NamedTemporaryFile(
                "w+b", dir=None if path == "-" else os.path.dirname(os.path.abspath(path)),
                prefix="." + (os.path.basename(path) if path != "-" else "intdet") + ".", suffix=".tmp",
                delete=False)
        except OSError as e:
            raise IntdetError(f"{where}: cannot create a file there ({e.strerror or e})", field="output") from None
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp.name, 0o666 & ~umask)  # as open() would create it, not mkstemp's 0600
            yield _Sink(tmp, where)
            try:
                tmp.flush()  # a full disk shows here at the latest (or at fsync)
                if path != "-":
                    os.fsync(tmp.fileno())
                    tmp.close()
                    _place(tmp.name, path, force)
            except OSError as e:
                raise _cannot_write(where, e) from None
            if path == "-":
                tmp.seek(0)
                try:
                    shutil.copyfileobj(tmp, sys.stdout.buffer)
                    sys.stdout.buffer.flush()
                except BrokenPipeError:
                    raise
                except OSError as e:  # stdout redirected to a full disk
                    raise _cannot_write("-o - (standard output)", e) from None
                tmp.close()
                os.unlink(tmp.name)
        except BaseException:
            try:
                tmp.close()  # flushes what is buffered: on a full disk it fails again
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp.name)
            raise


def _place(tmp: str, path: str, force: bool) -> None:
    """Move the finished ``tmp`` to ``path``. Without ``force`` the move
    fails if ``path`` exists by now (another run made it while this one
    worked: a hard link is created only where no name is), instead of
    replacing it; a file system without hard links gets the check-then-rename."""
    if force:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise IntdetError(f"-o {path}: exists (made while this ran; use --force to replace it)") from None
    except OSError:  # no hard links here (some network and FAT file systems)
        if os.path.lexists(path):
            raise IntdetError(f"-o {path}: exists (made while this ran; use --force to replace it)") from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _bar(total, as_json: bool, desc: str):
    if as_json or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, file=sys.stderr)


def _engine(lm, device, threads):
    from ..model import Engine

    return Engine(lm, device, threads or None)


def _report(st, as_json, inp, out, verb):
    d = dict(st.as_dict(), input=inp, output=out)
    if as_json:
        click.echo(json.dumps(d), err=out == "-")
        return
    click.echo(f"intdet {verb}: {d['in_bytes']} -> {d['out_bytes']} bytes, {d['bits_per_byte']:.4f} bits/byte, "
               f"{d['tokens']} tokens in {d['chunks']} chunks ({d['stored_chunks']} stored), "
               f"{d['seconds']:.1f} s, {d['bytes_per_second'] / 1024:.2f} KiB/s", err=True)


@click.command()
@click.argument("inp", metavar="IN")
@click.option("-o", "--output", required=True, metavar="OUT", help="Compressed file ('-' = stdout).")
@model_option(help=MODEL_HELP_SHORT)
@weights_option(help="Linear weights when -m needs converting: int8 or int4.")
@click.option("--ctx", default=None, type=int,
              help="Most tokens per chunk (chunks are coded independently)  [default: 2048, or the model's "
                   "context length if shorter].")
@device_option(help=DEVICE_HELP)
@threads_option(help=THREADS_HELP)
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@json_option(help=JSON_HELP)
@user_errors
def compress(inp, output, model, weights, ctx, device, threads, force, as_json):
    """Compress IN ('-' = stdin) with the integer model's probabilities: any bytes, decodable on any machine."""
    from ..compress.codec import compress_stream

    if output == "-" or as_json:  # the data or the report would be lost
        _need_stdout()
    fin, name, size = _open_input(inp)
    need = None
    if size is not None and os.path.isfile(inp):  # not stdin or a pipe: its size is known up front
        from ..compress.codec import DEFAULT_CTX
        from ..compress.container import compressed_bound

        # chunks hold at least about ctx / 2 bytes (each token is a byte or more)
        need = compressed_bound(size, (ctx or DEFAULT_CTX) // 2)
    with fin as f, _output(output, force, inp, need, "the compressed file (at most its input's size and chunk "
                           "records)", "INTDET_SKIP_PREFLIGHT=1 tries anyway") as out:
        lm = _load(model, None, weights, False)
        eng = _engine(lm, device, threads)
        if ctx is None:
            ctx = min(2048, eng.context_length)
        bar = _bar(size, as_json, "compress")
        try:
            # the header names the model: a local path absolutely, so decompress finds it from any directory
            named = os.path.abspath(model) if model and os.path.exists(model) else (model or "")
            st = compress_stream(eng, f.read, out, ctx=ctx, model_name=named, weights=weights or "",
                                 progress=bar.update if bar else None)
        finally:
            if bar:
                bar.close()
    _report(st, as_json, name, output, "compress")


@click.command()
@click.argument("inp", metavar="IN")
@click.option("-o", "--output", required=True, metavar="OUT", help="Decompressed file ('-' = stdout).")
@model_option(help="Model to decode with (default: the one named in IN's header; its sha256 must match).")
@click.option("--batch", default=32, show_default=True, type=int,
              help="Chunks decoded together, one batch row each (memory: one KV cache per row).")
@device_option(help=DEVICE_HELP)
@threads_option(help=THREADS_HELP)
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@json_option(help=JSON_HELP)
@user_errors
def decompress(inp, output, model, batch, device, threads, force, as_json):
    """Decompress IN ('-' = stdin), made by intdet compress; checks the model and the output's sha256."""
    from ..compress.codec import decompress_stream
    from ..compress.container import read_header

    if batch < 1:
        raise IntdetError(f"--batch: {batch} must be >= 1")
    if output == "-" or as_json:
        _need_stdout()
    fin, name, _ = _open_input(inp)
    with fin as f:
        h = read_header(f, name)
        with _output(output, force, inp, h.orig_len, "the decompressed file") as out:
            # the header's --weights (int4) applies to a -m that needs converting, not to a converted dir
            from ..resolve import is_converted

            converted = bool(model) and os.path.isdir(model) and is_converted(model)
            lm = _load(model or h.model_name or None, None, None if converted else (h.weights or None), False)
            eng = _engine(lm, device, threads)
            bar = _bar(h.orig_len, as_json, "decompress")
            try:
                st = decompress_stream(eng, f, out, name, batch=batch, header=h,
                                       progress=bar.update if bar else None)
            finally:
                if bar:
                    bar.close()
    _report(st, as_json, name, output, "decompress")
