"""Thread count: auto (the default) takes every core this process may use,
fewer while other processes keep cores busy, and never changes a bit; a fixed
count is used as given; the CLI caps --threads at the cores with a warning."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from intdet import _core
from intdet.convert import convert
from intdet.model import Engine, default_threads, load_model

from conftest import using_isa

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12, 64, 128, 3, 77, 1, 2, 250]


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny_qwen3_hf):
    return Engine(load_model(convert(tiny_qwen3_hf, str(tmp_path_factory.mktemp("thr") / "m"), progress=False)))


def run(engine, steps=3):
    seq = engine.new_state(64)
    a = seq.forward(PROMPT, all_logits=True)
    b = [seq.forward([t]) for t in (9, 33, 101)[:steps]]
    return np.concatenate([a, *b])


@pytest.mark.parametrize("ncpu,ceiling,busy,total,self_,want", [
    (2, 2, 0, 200, 0, 2),        # idle
    (2, 2, 120, 200, 120, 2),    # busy only with our own threads (spinning included)
    (2, 2, 100, 200, 0, 1),      # another process holds one core
    (2, 2, 166, 200, 100, 1),    # ... while ours ran too
    (2, 2, 40, 200, 0, 2),       # 0.4 core of noise rounds away
    (2, 2, 200, 200, 0, 1),      # both cores taken: still one thread
    (16, 16, 400, 1600, 0, 12),  # 4 of 16 cores busy
    (16, 4, 0, 1600, 0, 4),      # OMP_NUM_THREADS=4 is the ceiling
    (2, 2, 0, 0, 0, 2),          # no time elapsed: the ceiling
    (2, 2, 10, 200, 50, 2),      # rounding of jiffies: never negative
])
def test_auto_rule(ncpu, ceiling, busy, total, self_, want):
    assert _core.auto_thread_count(ncpu, ceiling, busy, total, self_) == want


def test_settings_round_trip():
    before = _core.thread_setting()
    try:
        _core.set_num_threads(3)
        assert (_core.thread_setting(), _core.num_threads()) == (3, 3)
        _core.set_num_threads(0)
        assert _core.thread_setting() == 0 and _core.num_threads() == default_threads()
        _core.set_num_threads(-5)  # negative: auto, as 0
        assert _core.thread_setting() == 0
    finally:
        _core.set_num_threads(before)


def test_auto_gives_the_same_bits(engine):
    best = _core.available_isas()[-1]
    with using_isa("scalar", 1):
        want = run(engine)
    with using_isa(best, 0):
        got = run(engine)
        assert 1 <= _core.last_forward_threads() <= default_threads()
    assert np.array_equal(got, want)


@pytest.mark.skipif(default_threads() < 2, reason="needs 2 cores to see auto give one up")
def test_auto_yields_to_a_competing_load(engine):
    """With a spinning process per core, auto measures them and drops below
    the core count within a few samples (100 ms each); the bits do not move."""
    cores = default_threads()
    with using_isa("scalar", 1):
        want = run(engine, steps=1)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        used = []
        with using_isa(_core.available_isas()[-1], 0):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                got = run(engine, steps=1)
                assert np.array_equal(got, want)
                used.append(_core.last_forward_threads())
                if len(used) > 5 and used[-1] < cores:
                    break
                time.sleep(0.05)
        assert used[-1] < cores, used
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def test_omp_num_threads_caps_auto(tmp_path):
    code = "from intdet import _core; print(_core.num_threads(), _core.thread_setting())"
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OMP_NUM_THREADS": "1"},
                       capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["1", "0"]


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "intdet", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_cli_caps_threads_at_the_cores(engine):
    cores = default_threads()
    r = _cli("generate", "--ids", "5,17,99", "-n", "2", "--json", "-m", engine.lm.path, "--threads", "1000")
    assert r.returncode == 0, r.stderr
    assert f"warning: --threads 1000: this process may use {cores} core" in r.stderr
    assert r.stderr.count("\n") == 1


@pytest.mark.parametrize("cmd", [["generate", "--ids", "5"], ["bench", "--gen-tokens", "1"]])
def test_cli_refuses_negative_threads(engine, cmd):
    r = _cli(*cmd, "-m", engine.lm.path, "--threads", "-1")
    assert r.returncode == 1
    assert "--threads" in r.stderr and "[0, 1024]" in r.stderr and len(r.stderr.strip().splitlines()) == 1
