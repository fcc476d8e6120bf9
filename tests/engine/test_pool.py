"""The forward's thread pool (csrc/cpu/pool.cpp): forwards from several Python
threads at once (one holds the pool, the others run their tasks inline) give
the bits of one thread on the scalar set, at every thread count."""

import threading

import numpy as np
import pytest

from intdet import _core
from intdet.convert import convert
from intdet.model import Engine, load_model

from conftest import using_isa

PROMPTS = [[5, 17, 99, 230, 41, 7, 300, 12], [3, 77, 1, 2, 250, 64], [128, 9, 33, 101, 7]]


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny_llama_hf):
    return Engine(load_model(convert(tiny_llama_hf, str(tmp_path_factory.mktemp("pool") / "m"), progress=False)))


def run(engine, prompt):
    seq = engine.new_state(32)
    out = [seq.forward(prompt, all_logits=True)]
    for t in (9, 33, 101, 4):
        out.append(seq.forward([t]))
    return np.concatenate(out)


@pytest.mark.parametrize("threads", [2, 3, 5])
def test_concurrent_forwards_keep_the_bits(engine, threads):
    with using_isa("scalar", 1):
        want = [run(engine, p) for p in PROMPTS]
    got = [None] * len(PROMPTS)
    with using_isa(_core.available_isas()[-1], threads):
        def work(i):
            for _ in range(3):  # several rounds, so the calls overlap
                got[i] = run(engine, PROMPTS[i])

        ts = [threading.Thread(target=work, args=(i,)) for i in range(len(PROMPTS))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    for w, g in zip(want, got):
        assert np.array_equal(g, w)
