"""Int4 weights (``intdet convert --weights int4``, W4A16): the C++ core
against the numpy spec on every kernel set and thread count, prefill splits
and batches, the pinned golden values, the quantizer's grid and bound, and
the errors for models that cannot take int4."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import models
from intdet.convert import convert
from intdet.convert.quantize import W4_MAX, quant_rows_int4
from intdet.convert.sources import read_source
from intdet.errors import IntdetError
from oracle import generate
from intdet.model import Engine, load_model
from intdet.ref.ops import dequant_int4
from intdet.resolve import resolve_model

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12, 64, 128, 3, 77]  # as in test_engine.py

# Change only with a format change (scripts/update_golden.py prints them).
GOLDEN_INT4_MODEL_SHA256 = "13ecd0d7b3b86e95f148de12850da86b69fddf6db466684b5dc08f825b80af59"
GOLDEN_INT4_HASH = "89d4720ac7d9"  # format_version 2 (version 1: cc6dec042680)
GOLDEN_INT4_TOKENS = [183, 183, 183, 183, 183, 183, 183, 183, 183, 183, 66, 66, 66, 66, 66, 66]


@pytest.fixture(scope="module")
def src4(tmp_path_factory):
    return models.write_hf_model(str(tmp_path_factory.mktemp("int4_src")), "qwen3", **models.INT4_SHAPE)


@pytest.fixture(scope="module")
def model4(src4, tmp_path_factory):
    return convert(src4, str(tmp_path_factory.mktemp("int4") / "m"), progress=False, weights="int4")


def _run(engine):
    seq = engine.new_state(64)
    a = seq.forward(PROMPT, all_logits=True)
    b = [seq.forward([t]) for t in (9, 33, 101)]
    return np.concatenate([a, *b])


def test_files_hold_int4_linears(model4):
    lm = load_model(model4)
    assert lm.cfg["weight_format"] == "int4" and lm.cfg["weight_group_size"] == 32
    assert "blk.0.ffn_down.q" not in lm.tensors
    assert lm.tensors["blk.0.ffn_down.q4"].dtype == np.uint8
    assert lm.tensors["blk.0.ffn_down.q4"].shape == (96, 80)  # [H, F/2]
    assert lm.tensors["blk.0.ffn_down.gd"].shape == (96, 5)  # [H, F/32]
    assert lm.tensors["tok_embd.q"].dtype == np.int8  # embedding / lm_head stay int8


@pytest.fixture(scope="module")
def spec4(model4):
    return _run(Engine(load_model(model4), "ref"))


def test_core_matches_spec_every_isa_and_thread_count(model4, spec4, isa_threads):
    assert np.array_equal(_run(Engine(load_model(model4), "cpu")), spec4), isa_threads


def test_prefill_splits_and_batches(model4):
    e = Engine(load_model(model4), "cpu")
    whole = e.new_state(64).forward(PROMPT, all_logits=True)
    s = e.new_state(64)
    parts = [s.forward(PROMPT[a:b], all_logits=True) for a, b in ((0, 1), (1, 6), (6, 12))]
    assert np.array_equal(np.concatenate(parts), whole)
    seqs = [e.new_state(64) for _ in range(3)]
    outs = e.forward_batch(seqs, [PROMPT, PROMPT[:5], [7, 8]], all_logits=True)
    assert np.array_equal(outs[0], whole)
    assert np.array_equal(outs[1], e.new_state(64).forward(PROMPT[:5], all_logits=True))


def test_conversion_reproducible_and_golden(src4, tmp_path):
    code = ("import sys; from intdet.convert import convert; "
            "convert(sys.argv[1], sys.argv[2], progress=False, weights='int4')")
    shas = []
    for name in ("a", "b"):
        out = str(tmp_path / name)
        subprocess.run([sys.executable, "-c", code, src4, out], check=True)
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            shas.append(hashlib.sha256(f.read()).hexdigest())
    assert shas == [GOLDEN_INT4_MODEL_SHA256] * 2
    g = generate(Engine(load_model(str(tmp_path / "a")), "cpu"), PROMPT, 16)
    assert (g.hash, g.tokens) == (GOLDEN_INT4_HASH, GOLDEN_INT4_TOKENS)


def test_quant_rows_int4_bound_and_error():
    """|gd * u + gm| <= 2047 for every code on adversarial rows, and the
    grid error per weight at most half a step plus the integer rounding of
    gd and gm (8 units of the row scale)."""
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal(256), np.full(256, 5.0), np.full(256, -5.0), np.zeros(256),
            np.r_[np.full(32, 1e-6), rng.standard_normal(224) * 100], np.linspace(-3, 1, 256),
            np.where(np.arange(256) % 2, 7.0, -7.0)]
    w = np.stack(rows)
    w4, gd, gm, s = quant_rows_int4(w)
    assert (gd >= 0).all() and (np.abs(gm) <= W4_MAX).all() and (np.abs(gm + 15 * gd.astype(np.int64)) <= W4_MAX).all()
    we = dequant_int4(w4, gd, gm)
    err = np.abs(we * s[:, None] - w)
    step = np.repeat(gd, 32, axis=1) * s[:, None]
    assert (err <= step / 2 + 8 * s[:, None] + 1e-12).all()


def test_q4_1_source_keeps_its_codes(tmp_path):
    """A Q4_1 GGUF's blocks (min + step * code, 32 per block) land on the int4
    grid: each weight within 8 units of the row scale (the integer rounding
    of step and offset), far inside one Q4_1 step."""
    fm = read_source(models.write_gguf_model(str(tmp_path / "q41.gguf"), "Q4_1"))
    w = np.asarray(fm.weights["blk.0.ffn_gate"], dtype=np.float64)
    w4, gd, gm, s = quant_rows_int4(w)
    err = np.abs(dequant_int4(w4, gd, gm) * s[:, None] - w)
    assert (err <= 8 * s[:, None] + 1e-12).all()
    g = w.reshape(w.shape[0], -1, 32)
    q41_step = (g.max(axis=2) - g.min(axis=2)) / 15
    assert err.max() < 0.25 * q41_step.max()


def test_converting_a_converted_model_is_refused(model4, tmp_path):
    with pytest.raises(IntdetError, match="already a converted intdet model"):
        convert(model4, str(tmp_path / "again"), progress=False)


def test_rows_not_multiple_of_32_refused(tmp_path, tiny_qwen3_hf):
    with pytest.raises(IntdetError, match="not a multiple of 32"):
        convert(tiny_qwen3_hf, str(tmp_path / "m"), progress=False, weights="int4")
    assert not os.path.exists(tmp_path / "m")
    with pytest.raises(IntdetError, match="choose int8 or int4"):
        convert(tiny_qwen3_hf, str(tmp_path / "m"), progress=False, weights="int2")


def test_bound_violation_and_format_mismatch_are_clear_errors(model4, tmp_path):
    import shutil

    from intdet.safetensors_io import SafetensorsFile, save_atomic

    bad = str(tmp_path / "bad")
    shutil.copytree(model4, bad)
    st = SafetensorsFile(os.path.join(bad, "model.safetensors"))
    t = {n: np.array(st.get(n)) for n in st.names()}
    del st
    good = {n: a.copy() for n, a in t.items()}

    def expect_refused(edit, match):
        t = {n: a.copy() for n, a in good.items()}
        edit(t)
        save_atomic(t, os.path.join(bad, "model.safetensors"), metadata={"format": "intdet"})
        with pytest.raises(IntdetError, match=match):
            load_model(bad)

    expect_refused(lambda t: t["blk.1.attn_v.gd"].__setitem__((0, 0), 300), r"blk\.1\.attn_v\.gd/\.gm' group \[0, 0\]")
    # gm = -32768 with gm + 15 gd = -8: abs(-32768) overflows in int16, the check must not
    def edge(t):
        t["blk.0.ffn_down.gd"][0, 0], t["blk.0.ffn_down.gm"][0, 0] = 2184, -32768
    expect_refused(edge, "gm -32768")
    expect_refused(lambda t: t.__setitem__("blk.0.attn_q.q", np.zeros((96, 96), np.int8)),
                   "'blk.0.attn_q.q' is int8 weights but config.json says weight_format int4")
    save_atomic(good, os.path.join(bad, "model.safetensors"), metadata={"format": "intdet"})
    load_model(bad)
    with pytest.raises(IntdetError, match="converted int4 model"):
        resolve_model(model4, weights="int8")
    assert resolve_model(model4, weights="int4") == model4
    cfg_path = os.path.join(bad, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["weight_format"] = "int3"
    json.dump(cfg, open(cfg_path, "w"))
    with pytest.raises(IntdetError, match="weight_format 'int3'"):
        load_model(bad)
    cfg["weight_format"], cfg["weight_group_size"] = "int4", 32.0
    json.dump(cfg, open(cfg_path, "w"))
    with pytest.raises(IntdetError, match="weight_group_size 32"):
        load_model(bad)


def test_cache_entry_of_another_format_is_reconverted(src4, tmp_path, monkeypatch):
    from intdet.resolve import converted_path

    monkeypatch.setenv("INTDET_CACHE", str(tmp_path / "cache"))
    p8 = converted_path(src4, progress=False)
    p4 = converted_path(src4, progress=False, weights="int4")
    assert p8 != p4 and load_model(p4).cfg["weight_format"] == "int4"
    import shutil

    shutil.rmtree(p4)
    shutil.copytree(p8, p4)  # an int8 model where the int4 entry belongs
    assert converted_path(src4, progress=False, weights="int4") == p4
    assert load_model(p4).cfg.get("weight_format") == "int4"


def test_cli_convert_and_generate(src4, tmp_path):
    out = str(tmp_path / "cli4")
    r = subprocess.run([sys.executable, "-m", "intdet.cli", "convert", src4, "-o", out, "--weights", "int4"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "intdet.cli", "generate", "-m", out, "--ids",
                        ",".join(map(str, PROMPT)), "-n", "16", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hash"] == GOLDEN_INT4_HASH
    for args in (["convert", src4, "-o", str(tmp_path / "x"), "--weights", "int2"],
                 ["generate", "-m", out, "--weights", "INT4", "--ids", "1"],
                 ["generate", "-m", out, "--weights", "int8", "--ids", "1"]):
        r = subprocess.run([sys.executable, "-m", "intdet.cli", *args], capture_output=True, text=True)
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and r.stderr.startswith("intdet: error: --weights"), r.stderr
