"""`intdet convert -o OUT [--force]` never destroys anything but an intdet
model directory, never the source, and swaps a replaced model in by rename
so an interruption leaves the old model or the new one."""

import errno
import json
import os
import signal
import stat
import subprocess
import sys

import pytest

from intdet.convert import convert, output
from intdet.errors import IntdetError
from intdet.format import is_converted


def _tree(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


def _leftovers(parent):
    return [n for n in os.listdir(parent) if n.startswith(output.TMP_PREFIX)]


def _cli(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "intdet.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env)


@pytest.fixture(scope="module")
def model_a(tiny_llama_gguf, tmp_path_factory):
    """A converted model (int8) to replace and to compare with."""
    return convert(tiny_llama_gguf, str(tmp_path_factory.mktemp("a") / "m"), progress=False)


def test_force_refuses_a_folder_of_notes(tiny_llama_gguf, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    r = _cli("convert", tiny_llama_gguf, "-o", ".", "--force", cwd=str(tmp_path))
    assert r.returncode == 1 and "not an intdet model directory" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert _tree(str(tmp_path)) == {"notes.txt": b"mine"}


def test_force_never_deletes_the_source(tiny_llama_gguf, tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    src = d / "model.gguf"
    src.write_bytes(open(tiny_llama_gguf, "rb").read())
    with pytest.raises(IntdetError, match="holds the source"):
        convert(str(src), str(d), force=True, progress=False)
    assert src.read_bytes() == open(tiny_llama_gguf, "rb").read()


def test_force_refuses_a_home_directory(tiny_llama_gguf, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("x")
    r = _cli("convert", tiny_llama_gguf, "-o", str(home), "--force")  # what `-o ~` becomes in a shell
    assert r.returncode != 0 and (home / ".bashrc").read_text() == "x"


def test_force_refuses_a_file_and_a_link(tiny_llama_gguf, tmp_path, model_a):
    f = tmp_path / "f"
    f.write_text("data")
    with pytest.raises(IntdetError, match="not a directory"):
        convert(tiny_llama_gguf, str(f), force=True, progress=False)
    assert f.read_text() == "data"
    link = tmp_path / "link"
    link.symlink_to(model_a)
    with pytest.raises(IntdetError, match="symbolic link"):
        convert(tiny_llama_gguf, str(link), force=True, progress=False)
    assert os.path.islink(link) and is_converted(model_a)


def test_force_refuses_a_model_dir_with_a_foreign_file(tiny_llama_gguf, tmp_path, model_a):
    d = tmp_path / "m"
    os.mkdir(d)
    for n, b in _tree(model_a).items():
        (d / n).write_bytes(b)
    (d / "my-notes.md").write_text("keep")
    with pytest.raises(IntdetError, match="my-notes.md"):
        convert(tiny_llama_gguf, str(d), force=True, progress=False)
    assert (d / "my-notes.md").read_text() == "keep"


def test_without_force_a_non_empty_dir_is_refused_and_an_empty_one_used(tiny_llama_gguf, tmp_path, model_a):
    d = tmp_path / "m"
    os.mkdir(d)
    convert(tiny_llama_gguf, str(d), progress=False)  # empty: no --force needed
    assert _tree(str(d)) == _tree(model_a)
    with pytest.raises(IntdetError, match="not empty"):
        convert(tiny_llama_gguf, str(d), progress=False)


def test_force_replaces_a_model_and_leaves_no_temporary(tiny_llama_gguf, tiny_qwen3_hf, tmp_path, model_a):
    d = tmp_path / "m"
    convert(tiny_qwen3_hf, str(d), progress=False)
    old = _tree(str(d))
    convert(tiny_llama_gguf, str(d), force=True, progress=False)
    new = _tree(str(d))
    assert new == _tree(model_a) and new != old
    assert _leftovers(str(tmp_path)) == []


def _interrupting(fn, at, how, calls):
    """fn, with call number ``at`` (0-based) disturbed: how = "before" sends
    this process a real SIGINT before the call, "after" after it, "fail"
    raises OSError instead of making it."""
    def wrapped(*a):
        calls.append(1)
        n = len(calls) - 1
        if n == at and how == "before":
            os.kill(os.getpid(), signal.SIGINT)
        if n == at and how == "fail":
            raise OSError(errno.EIO, "simulated failure")
        r = fn(*a)
        if n == at and how == "after":
            os.kill(os.getpid(), signal.SIGINT)
        return r
    return wrapped


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_interrupt_during_the_swap_keeps_a_whole_model(tiny_llama_gguf, tiny_qwen3_hf, tmp_path, model_a, monkeypatch,
                                                       exchange):
    """A real SIGINT (Ctrl-C) before or after each rename of the swap, or a
    rename that fails: OUT holds the old model or the new one, whole, and no
    temporary directory stays."""
    d = tmp_path / "m"
    convert(tiny_qwen3_hf, str(d), progress=False)
    old, new = _tree(str(d)), _tree(model_a)
    real_exchange = output._renameat2_exchange()
    if exchange:
        probe_a, probe_b = tmp_path / "pa", tmp_path / "pb"
        probe_a.mkdir(), probe_b.mkdir()
        if real_exchange is None or real_exchange(str(probe_a), str(probe_b)) != 0:
            pytest.skip("no renameat2(RENAME_EXCHANGE) on this system or file system")
        cases = [(0, "before", old), (0, "after", new)]
    else:
        # SIGINT is deferred between the two renames: the swap completes,
        # then Ctrl-C acts. A failing second rename puts the old model back.
        cases = [(0, "before", new), (1, "before", new), (1, "after", new), (1, "fail", old)]
    for at, how, want in cases:
        calls = []
        if exchange:
            fn = _interrupting(real_exchange, at, how, calls)
            monkeypatch.setattr(output, "_renameat2_exchange", lambda fn=fn: fn)
        else:
            monkeypatch.setattr(output, "_renameat2_exchange", lambda: None)
            monkeypatch.setattr(os, "rename", _interrupting(os.rename, at, how, calls))
        with pytest.raises((KeyboardInterrupt, OSError, IntdetError)):  # a failed write: IntdetError naming OUT
            convert(tiny_llama_gguf, str(d), force=True, progress=False)
        monkeypatch.undo()
        assert calls, "the swap was not reached"
        assert _tree(str(d)) == want, (at, how)
        assert _leftovers(str(tmp_path)) == []
        if want == new:  # the old model back for the next case
            convert(tiny_qwen3_hf, str(d), force=True, progress=False)


def test_model_files_are_readable_by_others(tiny_llama_gguf, tmp_path):
    old = os.umask(0o022)
    try:
        d = convert(tiny_llama_gguf, str(tmp_path / "m"), progress=False)
    finally:
        os.umask(old)
    for n in os.listdir(d):
        assert stat.S_IMODE(os.stat(os.path.join(d, n)).st_mode) == 0o644, n
    assert json.load(open(os.path.join(d, "config.json")))["format"] == "intdet"
