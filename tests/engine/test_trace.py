"""Named intermediates: the C++ forward's trace has the ref spec's names,
order, shapes and every bit on each kernel set and thread count; tracing
changes no logit; first_divergence (and scripts/first_divergence.py) names
the first tensor a deliberately broken ref op changes."""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import models
from intdet import _core
from intdet.convert import convert
from intdet.model import Engine, load_model
from intdet.ref import ops as ref_ops
from intdet.trace import compare_backends, first_divergence, trace_cpu, trace_names, trace_ref

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IDS = [5, 17, 99, 230, 41, 7, 300, 12]


@pytest.fixture(scope="module", params=["qwen3-int8", "qwen2-int8", "qwen3-int4"])
def model_dir(request, tmp_path_factory):
    arch, weights = request.param.split("-")
    d = tmp_path_factory.mktemp(request.param)
    shape = models.INT4_SHAPE if weights == "int4" else {}
    src = models.write_hf_model(str(d / "src"), arch, **shape)
    return convert(src, str(d / "m"), progress=False, weights=weights)


@pytest.fixture(scope="module")
def engine(model_dir):
    return Engine(load_model(model_dir), "cpu")


@pytest.fixture(scope="module")
def ref_trace(engine):
    return trace_ref(engine.lm, IDS)


def test_cpu_trace_is_the_ref_trace(engine, ref_trace, isa_threads):
    names = trace_names(engine.lm.cfg)
    cpu = trace_cpu(engine, IDS)
    assert list(ref_trace) == names and list(cpu) == names  # every name, in forward order
    for name in names:
        assert cpu[name].shape == ref_trace[name].shape, name
        assert np.array_equal(cpu[name], ref_trace[name]), name
    assert first_divergence(ref_trace, cpu, names) is None


def test_trace_changes_no_logit_and_runs_the_named_set(engine):
    seq = engine.new_state(len(IDS))
    want = seq.forward(IDS, all_logits=True)
    before = _core.isa()
    for isa in _core.available_isas():
        state = _core.State(engine._model, len(IDS))
        logits, named, used = _core.forward_trace(engine._model, state, np.asarray(IDS, np.int32), 0, isa.upper())
        assert used == isa and _core.isa() == before  # this call only: the active set is untouched
        assert np.array_equal(logits, want), isa
        assert np.array_equal(named["output"], want), isa
        assert state.n_past == len(IDS)


def test_forward_trace_checks_its_arguments(engine):
    state = _core.State(engine._model, 4)
    with pytest.raises(ValueError, match="KV cache"):
        _core.forward_trace(engine._model, state, np.asarray(IDS, np.int32), 0)
    with pytest.raises(ValueError, match="no such kernel set"):
        _core.forward_trace(engine._model, state, np.asarray(IDS[:2], np.int32), 0, "sse9")


def _off_by_one(out):
    out.flat[0] += 1


def _last_row_negated(out):
    out[-1] = -out[-1]


def _broken_at(call, fn, spoil=_off_by_one):
    """fn whose result of call number `call` (0-based) is spoiled."""
    n = [0]

    def broken(*a, **k):
        out = fn(*a, **k)
        if n[0] == call:
            out = np.array(out, copy=True)
            spoil(out)
        n[0] += 1
        return out

    return broken


@pytest.mark.parametrize("op,call,spoil,first", [
    ("swiglu", 0, _off_by_one, "blk.0.ffn_swiglu"),
    ("swiglu", 1, _off_by_one, "blk.1.ffn_swiglu"),  # layer 0 still agrees: the first difference is named
    # RoPE'd q is not traced: attention's output is the first it reaches (the
    # last token's, which attends to more than one position)
    ("rope", 0, _last_row_negated, "blk.0.attn_out"),
    ("shift_round_sat32", 0, _off_by_one, "tok_embd"),
])
def test_first_divergence_names_the_broken_op(engine, monkeypatch, op, call, spoil, first):
    monkeypatch.setattr(ref_ops, op, _broken_at(call, getattr(ref_ops, op), spoil))
    (backend, div), = compare_backends(engine, IDS, ["ref", _core.available_isas()[-1]])
    assert div is not None and div[0] == first, div
    assert "values differ" in div[1]


def test_first_divergence_shapes_and_missing_names():
    a = {"x": np.zeros((2, 3), np.int64), "y": np.zeros(4, np.int64)}
    assert first_divergence(a, dict(a), ["x", "y", "absent"]) is None
    assert first_divergence(a, {"x": np.zeros((3, 2), np.int64), "y": a["y"]}, ["x", "y"])[0] == "x"
    assert first_divergence(a, {"x": a["x"]}, ["x", "y"]) == ("y", "recorded by the first side only")
    b = {"x": a["x"], "y": np.array([0, 0, 5, 0], np.int64)}
    assert first_divergence(a, b, ["x", "y"]) == ("y", "1 of 4 values differ; first at (2,): 0 vs 5")


def _script():
    path = os.path.join(ROOT, "scripts", "first_divergence.py")
    spec = importlib.util.spec_from_file_location("first_divergence", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_script_agrees_then_names_the_broken_op(model_dir, monkeypatch, capsys):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "first_divergence.py"), "-m", model_dir,
                        "--ids", ",".join(map(str, IDS))], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert [ln.split(" vs ")[0] for ln in lines] == _core.available_isas()
    assert all(" vs ref: all " in ln and " tensors agree" in ln for ln in lines), lines
    monkeypatch.setattr(ref_ops, "swiglu", _broken_at(0, ref_ops.swiglu))
    assert _script().main(["-m", model_dir, "--ids", "5,17,99", "--backends", "ref,scalar"]) == 1
    assert "scalar vs ref: first divergence at blk.0.ffn_swiglu" in capsys.readouterr().out
