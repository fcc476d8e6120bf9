"""Every kernel set this CPU runs, at 1, 2 and 3 threads, gives the same
logits bit for bit as the scalar kernels at 1 thread; kernel sets are named
in any case, the errors list the valid names, and switching sets while a
forward runs is safe."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from intdet import _core
from intdet.convert import convert
from intdet.model import Engine, load_model

from conftest import ISAS, using_isa

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12, 64, 128, 3, 77, 1, 2, 250]


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny_qwen3_hf):
    return Engine(load_model(convert(tiny_qwen3_hf, str(tmp_path_factory.mktemp("isa") / "m"), progress=False)))


def run(engine):
    seq = engine.new_state(64)
    a = seq.forward(PROMPT, all_logits=True)
    b = [seq.forward([t]) for t in (9, 33, 101)]
    return np.concatenate([a, *b])


@pytest.fixture(scope="module")
def want(engine):
    with using_isa("scalar", 1):
        return run(engine)


def test_all_isas_and_threads_bit_exact(engine, want, isa_threads):
    assert _core.isa() == isa_threads[0] and _core.num_threads() == isa_threads[1]
    assert np.array_equal(run(engine), want), isa_threads


def test_unknown_isa_is_refused():
    with pytest.raises(ValueError, match="no such kernel set"):
        _core.set_isa("sse9")


def test_isa_names_match_in_any_case():
    for name in ISAS:
        with using_isa(name.upper()):
            assert _core.isa() == name
        with using_isa(name.capitalize()):
            assert _core.isa() == name


def test_unknown_isa_error_lists_the_choices():
    with pytest.raises(ValueError) as info:
        _core.set_isa("avx1024")
    assert str(info.value) == f"ISA 'avx1024': this build has no such kernel set (choose {', '.join(ISAS)})"


def _core_in_subprocess(env_isa, code):
    env = dict(os.environ, INTDET_ISA=env_isa)
    return subprocess.run([sys.executable, "-c", "from intdet import _core\n" + code], env=env,
                          capture_output=True, text=True)


def test_intdet_isa_env_error_lists_the_choices():
    r = _core_in_subprocess("avx1024", "_core.kernels_ready()")
    assert r.returncode == 1
    want = f"ValueError: INTDET_ISA=avx1024: this build has no such kernel set (choose {', '.join(ISAS)})"
    assert r.stderr.strip().splitlines()[-1] == want, r.stderr


def test_intdet_isa_env_any_case():
    r = _core_in_subprocess(ISAS[-1].upper(), "print(_core.isa())")
    assert r.returncode == 0 and r.stdout.strip() == ISAS[-1], r.stderr


def test_set_isa_from_another_thread_mid_forward(engine, want):
    """Forwards running while another thread keeps switching the kernel set:
    each call takes one set at its start, and every set has the model's
    packed weights, so every result has all the bits of the reference. (Sets
    agree bit for bit, so bits alone cannot show a mixed call; this checks
    the switch is safe under load: no crash, no missing packed copy.)"""
    stop = threading.Event()
    switches = [0]

    def toggle():
        while not stop.is_set():
            for name in ISAS:
                _core.set_isa(name)
                switches[0] += 1

    with using_isa(ISAS[-1], 2):
        t = threading.Thread(target=toggle)
        t.start()
        try:
            for _ in range(4):
                assert np.array_equal(run(engine), want)
        finally:
            stop.set()
            t.join()
    assert switches[0] > len(ISAS)
