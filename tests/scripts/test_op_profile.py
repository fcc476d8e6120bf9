"""The per-op wall-time profile (scripts/profile_cpu.py): every op of every
layer is named once per forward, the ops add up to the forward's time, it
records nothing while off, and it changes no bit."""

import numpy as np
import pytest

from intdet import _core
from intdet.convert import convert
from intdet.model import Engine, load_model

from conftest import using_isa

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12]
LAYER_OPS = ["attn_norm", "attn_qkv", "qk_norm", "rope_kv", "attention", "attn_output", "ffn_norm", "ffn_gate_up",
             "ffn_down"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny_qwen3_hf):
    lm = load_model(convert(tiny_qwen3_hf, str(tmp_path_factory.mktemp("prof") / "m"), progress=False))
    return Engine(lm), lm.cfg["num_layers"]


def run(engine):
    seq = engine.new_state(16)
    return np.concatenate([seq.forward(PROMPT, all_logits=True), seq.forward([9]), seq.forward([33])])


@pytest.mark.parametrize("threads", [1, 2])
def test_profile_names_every_op_and_keeps_the_bits(engine, threads):
    engine, n_layers = engine
    with using_isa(_core.available_isas()[-1], threads):
        want = run(engine)
        _core.set_op_profile(True)
        try:
            got = run(engine)
            prof = _core.op_profile()
        finally:
            _core.set_op_profile(False)
    assert np.array_equal(got, want)
    layers = sorted({layer for _op, layer, _c, _ns in prof if layer >= 0})
    assert layers == list(range(n_layers))
    for layer in layers:  # Qwen3 has q/k norms: every op, in forward order, once per forward (3 forwards)
        ops = [(op, calls) for op, lay, calls, _ns in prof if lay == layer]
        assert ops == [(op, 3) for op in LAYER_OPS]
    outer = {op: (calls, ns) for op, lay, calls, ns in prof if lay == -1}
    assert set(outer) == {"embed", "output", "forward"} and all(c == 3 for c, _ in outer.values())
    assert all(ns >= 0 for *_x, ns in prof)
    total = sum(ns for op, _lay, _c, ns in prof if op != "forward")
    assert total == outer["forward"][1]  # the marks tile the forward exactly


def test_profile_off_records_nothing(engine):
    engine, _ = engine
    _core.set_op_profile(True)
    _core.set_op_profile(False)
    run(engine)
    assert _core.op_profile() == []
