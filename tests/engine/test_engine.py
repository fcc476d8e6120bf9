"""The integer engine end to end on tiny models: C++ against the numpy spec
(all bits), prefill/decode invariance, agreement with the float reference,
and pinned golden values."""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from intdet.convert import convert
from intdet.convert.sources import read_source
from intdet.floatref import FloatModel
from oracle import generate
from intdet.model import Engine, load_model

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12, 64, 128, 3, 77]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "gguf"])
def converted(request, tmp_path_factory, tiny_llama_hf, tiny_qwen2_hf, tiny_qwen3_hf, tiny_llama_gguf):
    src = {"llama": tiny_llama_hf, "qwen2": tiny_qwen2_hf, "qwen3": tiny_qwen3_hf, "gguf": tiny_llama_gguf}[request.param]
    out = str(tmp_path_factory.mktemp("conv") / request.param)
    convert(src, out, progress=False)
    return src, out


def run_all(engine, tokens, chunks):
    seq = engine.new_state(64)
    outs = []
    i = 0
    for c in chunks:
        outs.append(seq.forward(tokens[i:i + c], all_logits=True))
        i += c
    return np.concatenate(outs)


def test_cpp_matches_spec_bit_for_bit(converted):
    _, out = converted
    lm = load_model(out)
    cpu = run_all(Engine(lm, "cpu"), PROMPT, [len(PROMPT)])
    ref = run_all(Engine(lm, "ref"), PROMPT, [5, 1, 6])
    assert cpu.dtype == np.int32 and ref.dtype == np.int32
    assert np.array_equal(cpu, ref)


def test_prefill_split_invariance(converted):
    _, out = converted
    eng = Engine(load_model(out), "cpu")
    whole = run_all(eng, PROMPT, [len(PROMPT)])
    one_by_one = run_all(eng, PROMPT, [1] * len(PROMPT))
    chunks = run_all(eng, PROMPT, [7, 5])
    assert np.array_equal(whole, one_by_one)
    assert np.array_equal(whole, chunks)
    assert np.array_equal(whole, run_all(eng, PROMPT, [len(PROMPT)]))  # same run twice


@pytest.mark.parametrize("device", ["cpu", "ref"])
def test_logits_into_a_reused_buffer(converted, device):
    """forward(out=...) and forward_batch(out=...) write the same bits into
    the caller's array (returned as is, or views of it) as a new array gets;
    a wrong shape, dtype or layout is refused before anything runs."""
    _, out = converted
    eng = Engine(load_model(out), device)
    want = run_all(eng, PROMPT, [len(PROMPT)])
    buf = np.full((len(PROMPT) + 3, eng.vocab_size), 7, np.int32)
    seq = eng.new_state(64)
    got = seq.forward(PROMPT, all_logits=True, out=buf[:len(PROMPT)])
    assert np.shares_memory(got, buf) and np.array_equal(got, want)
    assert (buf[len(PROMPT):] == 7).all()  # rows past the call untouched
    for bad in (np.zeros((len(PROMPT), eng.vocab_size), np.int64),  # dtype
                np.zeros((len(PROMPT) - 1, eng.vocab_size), np.int32),  # shape
                np.zeros((eng.vocab_size, len(PROMPT)), np.int32).T):  # not C-contiguous
        s2 = eng.new_state(64)
        with pytest.raises((ValueError, TypeError)):
            s2.forward(PROMPT, all_logits=True, out=bad)
        if device == "cpu":
            assert s2.n_past == 0
    if device == "cpu":
        a, b = eng.new_state(64), eng.new_state(64)
        alone = [run_all(eng, PROMPT[:5], [5])[-1:], run_all(eng, PROMPT[:3], [3])]
        res = eng.forward_batch([a, b], [PROMPT[:5], PROMPT[:3]], all_logits=[False, True], out=buf[:4])
        assert all(np.shares_memory(r, buf) for r in res)
        assert np.array_equal(res[0], alone[0]) and np.array_equal(res[1], alone[1])
        with pytest.raises(ValueError, match="out: shape"):
            eng.forward_batch([eng.new_state(64)], [PROMPT[:2]], out=buf[:2])


def test_close_to_float_reference(converted):
    """Integer logits (Q16) against float64 on the same dequantized weights:
    RMS error under 4% of the logits' RMS and max |diff| under 0.4 (int8
    weights on random, unsmooth models; logits have std ~2), and the same
    greedy tokens for 20 steps."""
    src, out = converted
    fm = read_source(src)
    flt = FloatModel(fm, np.float64, max_len=64)
    eng = Engine(load_model(out), "cpu")
    li = run_all(eng, PROMPT, [len(PROMPT)]) / 65536.0
    lf = flt.forward(np.array(PROMPT), 0)
    rel = np.sqrt(np.mean((li - lf) ** 2) / np.mean(lf**2))
    assert rel < 0.04 and np.abs(li - lf).max() < 0.4
    # 20 greedy steps, teacher-forced with the float model's tokens: the
    # integer argmax must agree at every step where float's top-2 margin is
    # not a near-tie (< 0.1, smaller than int8 weight noise on these models).
    seq = eng.new_state(64)
    flt.reset()
    li, lf = seq.forward(PROMPT)[-1], flt.forward(np.array(PROMPT), 0)[-1]
    ties = 0
    for step in range(20):
        t = int(np.argmax(lf))
        top2 = np.sort(lf)[-2:]
        if top2[1] - top2[0] >= 0.1:
            assert int(np.argmax(li)) == t, f"step {step}"
        else:
            ties += 1
        li, lf = seq.forward([t])[-1], flt.forward(np.array([t]), len(PROMPT) + step)[-1]
    assert ties <= 3


def test_float_reference_matches_transformers(tiny_llama_hf, tiny_qwen2_hf, tiny_qwen3_hf):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for src in (tiny_llama_hf, tiny_qwen2_hf, tiny_qwen3_hf):
        hf = transformers.AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            want = hf(torch.tensor([PROMPT])).logits[0].double().numpy()
        got = FloatModel(read_source(src), np.float64, max_len=64).forward(np.array(PROMPT), 0)
        assert np.abs(got - want).max() < 1e-3


def test_gguf_matches_its_hf_twin(tiny_llama_hf, tiny_llama_gguf):
    """The GGUF has llama.cpp's permuted Q/K rows: after un-permuting, its
    float model must equal the HF checkpoint's (RoPE pairing is right)."""
    a = FloatModel(read_source(tiny_llama_hf), np.float64, max_len=64).forward(np.array(PROMPT), 0)
    b = FloatModel(read_source(tiny_llama_gguf), np.float64, max_len=64).forward(np.array(PROMPT), 0)
    assert np.abs(a - b).max() < 1e-4


# Golden values: change only with a format_version bump (scripts/update_golden.py prints them).
GOLDEN_MODEL_SHA256 = "8c6d6752f2ecc72e62451f7dec5fa42591965be82193069f1148dd913c79fb91"
GOLDEN_HASH = "2acafc3f4ae9"  # format_version 2 (version 1: a1ec3830d9b1, same logits: test_logits_golden.py)
GOLDEN_TOKENS = [4, 4, 4, 4, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100]


def _convert_in_subprocess(src, out):
    code = "import sys; from intdet.convert import convert; convert(sys.argv[1], sys.argv[2], progress=False)"
    subprocess.run([sys.executable, "-c", code, src, out], check=True)
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_conversion_reproducible_and_pinned(tiny_qwen3_hf, tmp_path):
    a = _convert_in_subprocess(tiny_qwen3_hf, str(tmp_path / "a"))
    b = _convert_in_subprocess(tiny_qwen3_hf, str(tmp_path / "b"))
    assert a == b
    for name in ("config.json", "tokenizer.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert a == GOLDEN_MODEL_SHA256


def test_golden_chain_hash(tiny_qwen3_hf, tmp_path):
    out = convert(tiny_qwen3_hf, str(tmp_path / "m"), progress=False)
    g = generate(Engine(load_model(out), "cpu"), PROMPT, 16)
    assert (g.hash, g.tokens) == (GOLDEN_HASH, GOLDEN_TOKENS)


def test_backend_controls(converted):
    """Engine's controls (what callers use instead of _core/_model): kernel
    set, threads, name, CUDA graphs, trace; they are the core's settings."""
    from conftest import ISAS, using_isa

    from intdet import _core
    from intdet.errors import IntdetError
    from intdet.trace import trace_ref

    lm = load_model(converted[1])
    eng, ref = Engine(lm, "cpu"), Engine(lm, "ref")
    assert eng.available_isas() == list(ISAS) and eng.isa == _core.isa()
    with using_isa(ISAS[0], 3):
        assert (eng.isa, eng.threads, eng.thread_setting) == (ISAS[0], 3, 3)
        eng.set_isa(ISAS[-1])
        eng.set_threads(2)
        assert (_core.isa(), _core.num_threads()) == (ISAS[-1], 2)
        eng.new_state(8).forward([1, 2, 3])
        assert 1 <= eng.last_forward_threads() <= 2
    with pytest.raises(IntdetError, match="sse9"):
        eng.set_isa("sse9")
    assert eng.device_name == f"cpu ({eng.isa})" and not eng.cuda_graphs
    with pytest.raises(IntdetError, match="cuda_graphs"):
        eng.cuda_graphs = True
    assert (ref.isa, ref.available_isas(), ref.threads) == ("ref", ["ref"], 1)
    with pytest.raises(IntdetError, match="one kernel set"):
        ref.set_isa("scalar")
    ids = [1, 5, 9, 13]
    got, want = eng.trace(ids, ISAS[0]), trace_ref(lm, ids)
    assert set(want) <= set(got) and all(np.array_equal(np.asarray(got[k], np.int64), want[k]) for k in want)
