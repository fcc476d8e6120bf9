"""Ctrl-C (SIGINT) during ``intdet generate`` and ``intdet convert``.

generate: the text generated so far stays on stdout, stderr ends with the
stats line and the chain hash of exactly those tokens (marked
"(interrupted)"), exit 130, no traceback.

convert (and the conversion into the cache that ``generate -m SRC`` does):
exit 130 with one line and no traceback; OUT is either complete (the
interrupt came after the final rename) or absent, no ``.intdet-convert-*``
temp dir is left, and the cache never holds a half-converted model.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import models
import pytest

CLI = [sys.executable, "-m", "intdet.cli"]
HASH_RE = re.compile(r"\bhash ([0-9a-f]{12})\b")
GEN_RE = re.compile(r"generated (\d+) tok")


def env_for(cache):
    return dict(os.environ, INTDET_CACHE=str(cache), HF_HUB_OFFLINE="1", PYTHONIOENCODING="utf-8")


class Proc:
    """A CLI subprocess whose stdout/stderr are drained by threads, so the
    test can wait for the first output bytes."""

    def __init__(self, args, cache):
        self.p = subprocess.Popen(CLI + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL, env=env_for(cache), bufsize=0)
        self.out, self.err = bytearray(), bytearray()
        self.first_out = threading.Event()
        self.threads = [threading.Thread(target=self._drain, args=(self.p.stdout, self.out, self.first_out), daemon=True),
                        threading.Thread(target=self._drain, args=(self.p.stderr, self.err, None), daemon=True)]
        for t in self.threads:
            t.start()

    @staticmethod
    def _drain(pipe, buf, event):
        while True:
            b = pipe.read(4096)
            if not b:
                return
            buf += b
            if event is not None:
                event.set()

    def sigint(self):
        self.p.send_signal(signal.SIGINT)

    def wait(self, timeout=60):
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            pytest.fail(f"no exit {timeout} s after SIGINT; stderr: {bytes(self.err)[-2000:]!r}")
        for t in self.threads:
            t.join(10)
        return rc, bytes(self.out).decode("utf-8", "replace"), bytes(self.err).decode("utf-8", "replace")


def run(args, cache, timeout=300):
    p = subprocess.run(CLI + [str(a) for a in args], capture_output=True, env=env_for(cache), timeout=timeout,
                       stdin=subprocess.DEVNULL, check=False)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


# ----------------------------------------------------------------- generate


@pytest.fixture(scope="module")
def long_ctx_model(tmp_path_factory):
    """Tiny llama with a 4096-token context, converted in process."""
    from intdet.convert import convert

    base = tmp_path_factory.mktemp("long_ctx")
    hf = models.write_hf_model(str(base / "hf"), "llama", max_position_embeddings=4096)
    return convert(hf, str(base / "conv"), progress=False)


@pytest.mark.parametrize("sampling", [[], ["--temperature", "0.7", "--seed", "11"]], ids=["greedy", "sampled"])
def test_ctrl_c_during_generate(long_ctx_model, tmp_path, sampling):
    cache = tmp_path / "cache"
    # The numpy spec backend is slow enough that the SIGINT always lands mid-run
    # (the C++ core can reach EOS first on a fast machine).
    args = ["generate", "-m", long_ctx_model, "--ids", "1,5,9", "-n", "100000", "--device", "ref", *sampling]
    pr = Proc(args, cache)
    assert pr.first_out.wait(120), f"no output; stderr: {bytes(pr.err)[-2000:]!r}"
    time.sleep(0.3)  # let a few more tokens through
    t0 = time.monotonic()
    pr.sigint()
    rc, out, err = pr.wait()
    assert time.monotonic() - t0 < 30
    assert rc == 130, (rc, out[-500:], err[-2000:])
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert lines and "(interrupted)" in lines[-1], err
    h, n = HASH_RE.search(lines[-1]).group(1), int(GEN_RE.search(lines[-1]).group(1))
    assert 1 <= n < 4000, lines[-1]
    assert out.endswith("\n"), out[-200:]
    # The hash and text are those of exactly the n tokens generated: a run
    # stopped by -n n gives the same chain hash and the same text.
    rc2, out2, err2 = run(["generate", "-m", long_ctx_model, "--ids", "1,5,9", "-n", n, *sampling], cache)
    assert rc2 == 0, err2
    assert HASH_RE.search(err2.splitlines()[-1]).group(1) == h
    assert out2 == out


# ------------------------------------------------------------------ convert


@pytest.fixture(scope="module")
def bigger_hf(tmp_path_factory):
    """A llama checkpoint big enough (~100 MB float32) that converting it
    takes a few seconds."""
    d = tmp_path_factory.mktemp("bigger") / "hf"
    return models.write_hf_model(str(d), "llama", hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                                 num_attention_heads=8, num_key_value_heads=2, head_dim=64)


def leftovers(parent):
    return [n for n in os.listdir(parent) if n.startswith(".intdet-convert-")] if os.path.isdir(parent) else []


def complete(out) -> bool:
    try:
        with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
            ok = json.load(f).get("format") == "intdet"
    except (OSError, ValueError):
        return False
    return ok and all(os.path.isfile(os.path.join(out, n)) for n in ("model.safetensors", "tokenizer.json"))


def interrupt_at(args, cache, delay, out_parent):
    """Run args, SIGINT after ``delay`` s (or as soon as a temp dir shows up
    in out_parent when delay is None)."""
    pr = Proc(args, cache)
    t0 = time.monotonic()
    if delay is None:
        while not leftovers(out_parent) and pr.p.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.002)
    else:
        time.sleep(delay)
    if pr.p.poll() is None:
        pr.sigint()
    return pr.wait()


# A SIGINT that comes once the work is done (the final rename made, or the
# interpreter already shutting down, when Python's default handler is back
# and the process dies of the signal: rc -2) leaves a complete OUT.
DONE_RCS = (0, 130, -signal.SIGINT)


def check_interrupted_or_complete(rc, err, out_dir):
    """True when the run was interrupted (exit 130, one line, no OUT);
    False when it finished (OUT complete)."""
    assert "Traceback" not in err, err
    parent = os.path.dirname(out_dir)
    assert leftovers(parent) == [], leftovers(parent)
    if complete(out_dir):
        assert rc in DONE_RCS, (rc, err)
        return False
    assert rc == 130, (rc, err)
    assert len(err.splitlines()) == 1 and "interrupted" in err, err
    assert not os.path.lexists(out_dir), os.listdir(out_dir)
    return True


def test_ctrl_c_during_convert(bigger_hf, tmp_path):
    cache = tmp_path / "cache"
    # an uninterrupted run: how long a conversion takes here
    t0 = time.monotonic()
    rc, _, err = run(["convert", bigger_hf, "-o", tmp_path / "full"], cache)
    full = time.monotonic() - t0
    assert rc == 0, err
    interrupted = 0
    for k, frac in enumerate([0.5, 0.75, None, 0.9, 0.35]):
        out = tmp_path / "outs" / f"out{k}"
        out.parent.mkdir(exist_ok=True)
        delay = None if frac is None else frac * full
        rc, _, err = interrupt_at(["convert", bigger_hf, "-o", out], cache, delay, str(out.parent))
        interrupted += check_interrupted_or_complete(rc, err, str(out))
    assert interrupted >= 2, "the conversion always finished before SIGINT"


def test_ctrl_c_during_conversion_into_cache(bigger_hf, tmp_path):
    """generate -m HF_DIR converts into the cache first; an interrupt there
    leaves the cache without any entry (no half model, no temp dir), and the
    next run converts and generates normally."""
    cache = tmp_path / "cache"
    models_dir = cache / "models"
    t0 = time.monotonic()
    args = ["generate", "-m", bigger_hf, "--ids", "1,2", "-n", "2"]
    rc, _, err = run(args, tmp_path / "cache0")
    full = time.monotonic() - t0
    assert rc == 0, err
    interrupted = 0
    for frac in (0.4, 0.6, None):
        rc, _, err = interrupt_at(args, cache, None if frac is None else frac * full, str(models_dir))
        assert "Traceback" not in err, err
        assert leftovers(models_dir) == []
        entries = os.listdir(models_dir) if models_dir.is_dir() else []
        assert all(complete(models_dir / e) for e in entries), entries  # never a half model
        if rc == 130 and "intdet: interrupted" in err:
            interrupted += 1
        else:
            assert rc in DONE_RCS, err
    assert interrupted >= 1
    rc, _, err = run(args, cache)
    assert rc == 0, err
    assert HASH_RE.search(err.splitlines()[-1])
