"""intdet compress / decompress onto a full disk: refused up front when the
output cannot fit (nothing done, nothing left); a write that fails anyway
(the estimate skipped, a quota, a file size limit) is one line naming the
output, exit 1, and leaves no temporary file behind.

A real full file system needs a small tmpfs (root); without one a file size
limit (RLIMIT_FSIZE: writes past it fail with EFBIG) takes the same path."""

import os
import resource
import subprocess
import sys

import pytest

from intdet.convert import convert
from intdet.errors import IntdetError

TEXT = b"The quick brown fox jumps over the lazy dog. Integer arithmetic is exact.\n" * 320  # 24 KiB
SMALL = 64 << 10  # the small file system's size
FREE = 8 << 10  # what the small file system keeps free for the output


@pytest.fixture(scope="module")
def tiny(tiny_llama_hf, tmp_path_factory):
    return convert(tiny_llama_hf, str(tmp_path_factory.mktemp("cz") / "m"), progress=False)


def run_cli(*args, env, **kw):
    return subprocess.run([sys.executable, "-m", "intdet", *args], capture_output=True, env=env, **kw)


def one_error_line(r, text: str):
    err = r.stderr.decode()
    assert r.returncode == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("intdet: error: ") and text in err, err


@pytest.fixture
def full_disk(tmp_path):
    """A SMALL-byte tmpfs with about FREE bytes left; skips where it cannot be
    mounted (not root, no CAP_SYS_ADMIN)."""
    d = tmp_path / "small"
    d.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL}", "tmpfs", str(d)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.decode().strip()}")
    try:
        st = os.statvfs(d)
        with open(d / "filler", "wb") as f:
            f.write(b"\0" * (st.f_bavail * st.f_frsize - FREE))
        os.makedirs(d / "out")
        yield d / "out"
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_full_disk_refused_up_front_and_cleaned_up(tiny, tmp_path, full_disk):
    env = dict(os.environ, INTDET_CACHE=str(tmp_path / "cache"))
    env.pop("INTDET_SKIP_PREFLIGHT", None)
    src, z = tmp_path / "a.txt", tmp_path / "a.idz"
    src.write_bytes(TEXT)
    r = run_cli("compress", str(src), "-o", str(z), "-m", tiny, "--ctx", "64", env=env)
    assert r.returncode == 0, r.stderr
    out = full_disk / "a.idz"
    # the estimate (the input's size) does not fit: refused before the model loads
    r = run_cli("compress", str(src), "-o", str(out), "-m", tiny, "--ctx", "64", env=env)
    one_error_line(r, f"-o {out}: the compressed file (at most its input's size and chunk records) needs ")
    assert f"but {full_disk} has " in r.stderr.decode() and "INTDET_SKIP_PREFLIGHT=1" in r.stderr.decode()
    back = full_disk / "a.txt"
    r = run_cli("decompress", str(z), "-o", str(back), env=env)
    need = f"{len(TEXT) / 1024:.1f} KiB"
    one_error_line(r, f"-o {back}: the decompressed file needs {need} but {full_disk} has ")
    r = run_cli("decompress", str(z), "-o", "-", env=dict(env, TMPDIR=str(full_disk)))
    one_error_line(r, f"-o -: the decompressed file needs {need} but {full_disk} has ")
    assert os.listdir(full_disk) == []
    # without the estimate the writes run into the full disk: one line naming OUT, no temporary file
    skip = dict(env, INTDET_SKIP_PREFLIGHT="1")
    r = run_cli("compress", str(src), "-o", str(out), "-m", tiny, "--ctx", "64", env=skip)
    one_error_line(r, f"-o {out}: cannot write (No space left on device)")
    assert os.listdir(full_disk) == []
    r = run_cli("decompress", str(z), "-o", str(back), env=skip)
    one_error_line(r, f"-o {back}: cannot write (No space left on device)")
    assert os.listdir(full_disk) == []
    r = run_cli("decompress", str(z), "-o", "-", env=dict(skip, TMPDIR=str(full_disk)))
    one_error_line(r, f"-o - (its temporary copy in {full_disk}): cannot write (No space left on device)")
    assert os.listdir(full_disk) == [] and r.stdout == b""


def _limit_file_size(n):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))  # SIGXFSZ: Python ignores it, so writes get EFBIG

    return apply


def test_failed_writes_leave_nothing_without_root(tiny, tmp_path):
    """The same path without a small file system: a file size limit makes
    the output's writes (and the close's flush after them) fail."""
    env = dict(os.environ, INTDET_CACHE=str(tmp_path / "cache"))
    src, z = tmp_path / "a.txt", tmp_path / "a.idz"
    src.write_bytes(TEXT)
    assert run_cli("compress", str(src), "-o", str(z), "-m", tiny, "--ctx", "64", env=env).returncode == 0
    assert z.stat().st_size > FREE and len(TEXT) > FREE
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out, back = out_dir / "a.idz", out_dir / "a.txt"
    r = run_cli("compress", str(src), "-o", str(out), "-m", tiny, "--ctx", "64", env=env,
                preexec_fn=_limit_file_size(FREE))
    one_error_line(r, f"-o {out}: cannot write (File too large)")
    assert os.listdir(out_dir) == []
    r = run_cli("decompress", str(z), "-o", str(back), env=env, preexec_fn=_limit_file_size(FREE))
    one_error_line(r, f"-o {back}: cannot write (File too large)")
    assert os.listdir(out_dir) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_removed_when_close_fails_too(tmp_path):
    """A full disk fails the write and then the close (which flushes the
    same buffer again): the temporary file is still removed, and the error
    names -o. /dev/full (every write: ENOSPC) takes the temporary file's
    descriptor."""
    from intdet.cli import compress as cli

    out = tmp_path / "o.idz"
    with pytest.raises((IntdetError, OSError)) as e:
        with cli._output(str(out), False) as f:
            full = os.open("/dev/full", os.O_WRONLY)
            os.dup2(full, f.fileno())
            os.close(full)
            f.write(b"x" * 100)  # buffered
            f.write(b"y" * (1 << 16))  # past the buffer: written, and refused
    assert os.listdir(tmp_path) == []
    assert isinstance(e.value, IntdetError) and str(e.value) == f"-o {out}: cannot write (No space left on device)"


def test_space_checked_before_the_temporary_file(tmp_path, monkeypatch):
    from intdet.cli import compress as cli

    class St:
        f_bavail, f_frsize, f_blocks = 10, 4096, 100  # 40 KiB free

    monkeypatch.delenv("INTDET_SKIP_PREFLIGHT", raising=False)
    monkeypatch.setattr(os, "statvfs", lambda p: St)
    out = tmp_path / "o"
    with pytest.raises(IntdetError, match=rf"^-o {out}: the output needs 1\.0 MiB but {tmp_path} has 40\.0 KiB free$"):
        with cli._output(str(out), False, need=1 << 20):
            pass
    assert os.listdir(tmp_path) == []
    with cli._output(str(out), False, need=40 << 10) as f:  # fits
        f.write(b"ok")
    assert out.read_bytes() == b"ok"
    monkeypatch.setenv("INTDET_SKIP_PREFLIGHT", "1")
    with cli._output(str(tmp_path / "p"), False, need=1 << 20) as f:
        f.write(b"ok")
    assert (tmp_path / "p").read_bytes() == b"ok"
