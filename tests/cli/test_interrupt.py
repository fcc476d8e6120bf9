"""Ctrl-C (SIGINT) and SIGTERM during ``intdet generate`` and ``intdet convert``.

Every signal here lands at a point the code names: the child process sends
it to itself when it reaches a stage of $INTDET_TEST_SIGNAL_AT
(intdet/testhook.py), never after a delay guessed from a timed run, which a
faster or slower machine would move out of the work.

generate: the text generated so far stays on stdout, stderr ends with the
stats line and the chain hash of exactly those tokens (marked
"(interrupted)"), exit 130, no traceback.

convert (and the conversion into the cache that ``generate -m SRC`` does):
SIGINT exits 130 with the one line ``intdet: interrupted``, SIGTERM 143 with
``intdet: terminated``; OUT is either complete (the signal came after the
final rename) or absent (or, with --force, the old model whole), no
``.intdet-convert-*`` temporary directory is left, and the cache never holds
a half-converted model. SIGKILL cannot be cleaned up after: the next
conversion into the same directory removes what it left.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from intdet.convert import convert, output

pytestmark = pytest.mark.slow  # real signals to real subprocesses, with waits

CLI = [sys.executable, "-m", "intdet.cli"]
HASH_RE = re.compile(r"\bhash ([0-9a-f]{12})\b")
GEN_RE = re.compile(r"generated (\d+) tok")
HOOK = "INTDET_TEST_SIGNAL_AT"
# how each signal ends the CLI: exit status and its one line on stderr
ENDS = {"SIGINT": (130, "intdet: interrupted"), "SIGTERM": (143, "intdet: terminated")}
STAGES_BEFORE_INSTALL = ["read", "quantize", "written", "install"]


def run(args, cache, at=None, timeout=300):
    """Run the CLI; ``at`` = "STAGE[:SIGNAL]" makes it signal itself there."""
    env = dict(os.environ, INTDET_CACHE=str(cache), HF_HUB_OFFLINE="1", PYTHONIOENCODING="utf-8")
    env.pop(HOOK, None)
    if at:
        env[HOOK] = at
    p = subprocess.run(CLI + [str(a) for a in args], capture_output=True, env=env, timeout=timeout,
                       stdin=subprocess.DEVNULL, check=False)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def leftovers(parent):
    return sorted(n for n in os.listdir(parent) if n.startswith(output.TMP_PREFIX)) if os.path.isdir(parent) else []


def tree(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


def complete(out) -> bool:
    try:
        with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
            ok = json.load(f).get("format") == "intdet"
    except (OSError, ValueError):
        return False
    return ok and all(os.path.isfile(os.path.join(out, n)) for n in ("model.safetensors", "tokenizer.json"))


def assert_ended_by(sig, rc, err):
    code, line = ENDS[sig]
    assert "Traceback" not in err, err
    assert rc == code and err.splitlines() == [line], (rc, err)


@pytest.fixture(scope="module")
def converted(tiny_llama_hf, tmp_path_factory):
    """tiny_llama_hf converted without interruption: what a complete OUT holds."""
    return convert(tiny_llama_hf, str(tmp_path_factory.mktemp("conv") / "m"), progress=False)


# ----------------------------------------------------------------- generate


@pytest.mark.parametrize("device,sampling", [("cpu", []), ("cpu", ["--temperature", "0.7", "--seed", "11"]),
                                             ("ref", [])], ids=["greedy", "sampled", "greedy-ref"])
def test_ctrl_c_during_generate(converted, tmp_path, device, sampling):
    cache = tmp_path / "cache"
    args = ["generate", "-m", converted, "--ids", "1,5,9", "--device", device, *sampling]
    rc, out, err = run(args + ["-n", 50], cache, at="token-7")
    assert rc == 130, (rc, out[-500:], err[-2000:])
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    assert "(interrupted)" in last and int(GEN_RE.search(last).group(1)) == 7, err
    assert re.search(r"prefill [0-9.]+ tok/s, decode [0-9.]+ tok/s", last), last  # rates of what ran
    assert out.endswith("\n"), out[-200:]
    # The hash and text are those of exactly the 7 tokens generated: a run
    # stopped by -n 7 gives the same chain hash and the same text.
    rc2, out2, err2 = run(args + ["-n", 7], cache)
    assert rc2 == 0, err2
    assert HASH_RE.search(err2.splitlines()[-1]).group(1) == HASH_RE.search(last).group(1)
    assert out2 == out


# ------------------------------------------------------------------ convert


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("stage", STAGES_BEFORE_INSTALL)
def test_signal_during_convert_leaves_nothing(tiny_llama_hf, tmp_path, stage, sig):
    out = tmp_path / "outs" / "m"
    out.parent.mkdir()
    rc, _, err = run(["convert", tiny_llama_hf, "-o", out], tmp_path / "cache", at=f"{stage}:{sig}")
    assert_ended_by(sig, rc, err)
    assert os.listdir(out.parent) == []  # neither OUT nor a temporary directory


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_signal_after_the_final_rename_leaves_the_whole_model(tiny_llama_hf, tmp_path, converted, sig):
    out = tmp_path / "outs" / "m"
    out.parent.mkdir()
    rc, _, err = run(["convert", tiny_llama_hf, "-o", out], tmp_path / "cache", at=f"installed:{sig}")
    assert_ended_by(sig, rc, err)
    assert os.listdir(out.parent) == ["m"] and tree(out) == tree(converted)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_signal_during_convert_force_keeps_a_whole_model(tiny_llama_hf, tiny_qwen3_hf, tmp_path, converted, sig):
    """--force over another model: the old model until the final rename, the
    new one after it, whole either way."""
    out = tmp_path / "outs" / "m"
    convert(tiny_qwen3_hf, str(out), progress=False)
    old = tree(out)
    for stage, want in [("written", old), ("install", old), ("installed", tree(converted))]:
        rc, _, err = run(["convert", tiny_llama_hf, "-o", out, "--force"], tmp_path / "cache", at=f"{stage}:{sig}")
        assert_ended_by(sig, rc, err)
        assert tree(out) == want, stage
        assert os.listdir(out.parent) == ["m"], stage


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_signal_during_conversion_into_cache(tiny_llama_hf, tmp_path, sig):
    """generate -m HF_DIR converts into the cache first; a signal there
    leaves the cache without any entry (no half model, no temporary
    directory), and the next run converts and generates normally."""
    cache = tmp_path / "cache"
    models_dir = cache / "models"
    args = ["generate", "-m", tiny_llama_hf, "--ids", "1,2", "-n", "2"]
    for stage in STAGES_BEFORE_INSTALL:
        rc, _, err = run(args, cache, at=f"{stage}:{sig}")
        # the conversion's notice (printed once the source is read, before every stage here) comes first
        note, _, rest = err.partition("\n")
        assert note.startswith(f"intdet: converting {tiny_llama_hf} into the cache"), (stage, err)
        assert_ended_by(sig, rc, rest)
        assert not models_dir.is_dir() or os.listdir(models_dir) == [], (stage, os.listdir(models_dir))
    rc, _, err = run(args, cache)
    assert rc == 0 and HASH_RE.search(err.splitlines()[-1]), err
    (entry,) = os.listdir(models_dir)
    assert complete(models_dir / entry)


def test_signal_after_conversion_into_cache_keeps_the_entry(tiny_llama_hf, tmp_path):
    cache = tmp_path / "cache"
    args = ["generate", "-m", tiny_llama_hf, "--ids", "1,2", "-n", "2"]
    rc, _, err = run(args, cache, at="installed:SIGTERM")
    note, _, rest = err.partition("\n")  # the conversion's notice first
    assert note.startswith("intdet: converting "), err
    assert_ended_by("SIGTERM", rc, rest)
    (entry,) = os.listdir(cache / "models")
    assert complete(cache / "models" / entry)


def test_sigkill_leftovers_are_swept_by_the_next_conversion_into_the_cache(tiny_llama_hf, tmp_path):
    """SIGKILL ends the process before any cleanup; the next conversion
    into the same cache directory removes the dead process's temporary
    directory."""
    cache = tmp_path / "cache"
    args = ["generate", "-m", tiny_llama_hf, "--ids", "1,2", "-n", "2"]
    rc, _, err = run(args, cache, at="written:SIGKILL")
    assert rc == -signal.SIGKILL, (rc, err)
    assert len(leftovers(cache / "models")) == 1  # what the issue saw: a temporary dir the kill left
    rc, _, err = run(args, cache)
    assert rc == 0, err
    assert leftovers(cache / "models") == []
    (entry,) = os.listdir(cache / "models")
    assert complete(cache / "models" / entry)


# -------------------------------------------------------------------- sweep


def dead_pid() -> int:
    """The PID of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_sweep_removes_only_dead_unlocked_temporaries(tmp_path, tiny_llama_hf):
    parent = tmp_path / "p"
    parent.mkdir()
    dead, live = dead_pid(), os.getpid()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")

    def mk(name):
        (parent / name).mkdir()
        (parent / name / "model.safetensors").write_bytes(b"partial")
        return parent / name

    stale = [f"{output.TMP_PREFIX}{dead}-0123abcd", f"{output.TMP_PREFIX}{dead}-4567cdef-old"]
    for n in stale:
        mk(n)
    keep = [f"{output.TMP_PREFIX}{live}-89abcdef", f"{output.TMP_PREFIX}{live}-89abcdef-old",
            f"{output.TMP_PREFIX}notes", f"{output.TMP_PREFIX}{dead}-xyz", "model"]
    for n in keep:
        mk(n)
    # a dead PID whose directory is locked: a live conversion in another PID
    # namespace (a container sharing the cache), and its parked old model
    locked = mk(f"{output.TMP_PREFIX}{dead}-aaaabbbb")
    mk(f"{output.TMP_PREFIX}{dead}-aaaabbbb-old")
    fd = os.open(locked, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    keep += [f"{output.TMP_PREFIX}{dead}-aaaabbbb", f"{output.TMP_PREFIX}{dead}-aaaabbbb-old"]
    # names of the pattern that are not directories: a file, and a link to a directory elsewhere
    (parent / f"{output.TMP_PREFIX}{dead}-00000000").write_text("file")
    (parent / f"{output.TMP_PREFIX}{dead}-11111111").symlink_to(outside)
    keep += [f"{output.TMP_PREFIX}{dead}-00000000", f"{output.TMP_PREFIX}{dead}-11111111"]
    try:
        assert sorted(output.sweep_stale(str(parent))) == sorted(stale)
        assert sorted(os.listdir(parent)) == sorted(keep)
        assert (outside / "keep").read_text() == "x"
        # a conversion into the same parent sweeps too (the lock still held)
        for n in stale:
            mk(n)
        convert(tiny_llama_hf, str(parent / "out"), progress=False)
        assert sorted(os.listdir(parent)) == sorted(keep + ["out"])
    finally:
        os.close(fd)
    assert sorted(output.sweep_stale(str(parent))) == [f"{output.TMP_PREFIX}{dead}-aaaabbbb",
                                                       f"{output.TMP_PREFIX}{dead}-aaaabbbb-old"]


def test_a_conversion_locks_its_temporary_directory(tiny_llama_hf, tmp_path, monkeypatch):
    """While convert() writes, its temporary directory is locked, so the
    sweep of a process that cannot see its PID leaves it alone."""
    seen = []
    real_save = output.install

    def spy(tmp, *a):
        seen.append(output._locked(tmp))
        return real_save(tmp, *a)

    monkeypatch.setattr("intdet.convert.install", spy)
    convert(tiny_llama_hf, str(tmp_path / "m"), progress=False)
    assert seen == [True]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # convert's SIGTERM handler is gone again
