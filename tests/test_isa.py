"""Every kernel set this CPU runs, at 1, 2 and 3 threads, gives the same
logits bit for bit as the scalar kernels at 1 thread."""

import numpy as np
import pytest

from intdet import _core
from intdet.convert import convert
from intdet.model import Engine, load_model

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12, 64, 128, 3, 77, 1, 2, 250]


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny_qwen3_hf):
    return Engine(load_model(convert(tiny_qwen3_hf, str(tmp_path_factory.mktemp("isa") / "m"), progress=False)))


def run(engine):
    seq = engine.new_sequence(64)
    a = seq.forward(PROMPT, all_logits=True)
    b = [seq.forward([t]) for t in (9, 33, 101)]
    return np.concatenate([a, *b])


def test_all_isas_and_threads_bit_exact(engine):
    before = (_core.isa(), _core.num_threads())
    try:
        _core.set_isa("scalar")
        _core.set_num_threads(1)
        want = run(engine)
        for isa in _core.available_isas():
            for th in (1, 2, 3):
                _core.set_isa(isa)
                _core.set_num_threads(th)
                assert np.array_equal(run(engine), want), (isa, th)
    finally:
        _core.set_isa(before[0])
        _core.set_num_threads(before[1])


def test_unknown_isa_is_refused():
    with pytest.raises(ValueError, match="no such kernel set"):
        _core.set_isa("sse9")
