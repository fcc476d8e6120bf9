"""A model that sets every optional feature the engines implement (q, k, v
and o biases, per-head q/k RMSNorm, an untied lm_head), and the Llama
`attention_bias` checkpoint whose o_proj bias one engine once dropped: every
tensor the converter writes is used by every engine, which all give one
chain hash (numpy spec, each CPU kernel set at 1 and 2 threads, the CUDA
kernels on the host emulator, the standalone intdet_run; aarch64 and s390x
in test_cross_arch.py), and the integer logits follow float."""

from __future__ import annotations

import numpy as np
import pytest

import models
from intdet import _core
from intdet.convert import convert
from intdet.convert.sources import read_source
from intdet.floatref import FloatModel
from oracle import generate
from intdet.model import Engine, load_model

pytestmark = pytest.mark.slow

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12]
STEPS = 12

# (name, architecture, HF config overrides, weight format)
CASES = {
    "qwen3-all": ("qwen3", dict(attention_bias=True, tie_word_embeddings=False), "int8"),
    "qwen3-all-int4": ("qwen3", dict(attention_bias=True, tie_word_embeddings=False, **models.INT4_SHAPE), "int4"),
    "llama-attention-bias": ("llama", dict(attention_bias=True), "int8"),
    # Gemma 3's features together: post-norms, GeGLU, window 5, two RoPE tables, biases, untied
    "gemma3-all": ("gemma3", dict(attention_bias=True, tie_word_embeddings=False), "int8"),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = {}
    for name, (arch, over, weights) in CASES.items():
        d = tmp_path_factory.mktemp(name)
        src = models.write_hf_model(str(d / "hf"), arch, **over)
        out[name] = (src, convert(src, str(d / "m"), progress=False, weights=weights))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_every_written_tensor_is_in_the_table(built, name):
    """The file holds exactly the table's tensors, the biases of all four
    projections among them, and the config describes them."""
    lm = load_model(built[name][1])
    table = {t[0] for p in _core.model_params(lm.cfg) for t in p["tensors"]}
    assert set(lm.tensors) == table
    for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
        assert f"blk.0.{n}.bias" in lm.tensors
    assert all(b["bias"] == ["attn_q", "attn_k", "attn_v", "attn_output"] for b in lm.cfg["layers"])


_SPEC = {}


def _spec_run(built, name):
    """The numpy spec's (hash, tokens), once per model."""
    if name not in _SPEC:
        g = generate(Engine(load_model(built[name][1]), "ref"), PROMPT, STEPS)
        _SPEC[name] = (g.hash, g.tokens)
    return _SPEC[name]


@pytest.mark.parametrize("name", list(CASES))
def test_one_hash_on_every_engine(built, name, isa_threads):
    """The C++ core on every kernel set and thread count gives the spec's hash."""
    g = generate(Engine(load_model(built[name][1]), "cpu"), PROMPT, STEPS)
    assert (g.hash, g.tokens) == _spec_run(built, name), isa_threads


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.cuda
def test_cuda_emulator_gives_the_cpu_logits(built, name):
    import test_cuda

    mod = test_cuda._emu_or_skip()
    lm = load_model(built[name][1])
    test_cuda._compare_model(mod, lm, False, PROMPT, 2, batch_co=1)


@pytest.mark.parametrize("name", list(CASES))
def test_intdet_run_gives_the_same_hash(built, name, tmp_path_factory):
    import test_cross_arch as xa

    why = xa._missing_build_tools()
    if why:
        pytest.skip(f"cannot build csrc/tools/intdet_run: {why}")
    tool = _tool(tmp_path_factory, xa)
    lm = load_model(built[name][1])
    g = generate(Engine(lm, "cpu"), PROMPT, STEPS)
    got = xa._run_tool([tool], built[name][1], PROMPT, STEPS, "--no-eos")
    assert (got["hash"], got["tokens"]) == (g.hash, g.tokens)


_TOOL = {}


def _tool(tmp_path_factory, xa):
    if "bin" not in _TOOL:
        _TOOL["bin"] = xa._build(str(tmp_path_factory.mktemp("intdet_run")))
    return _TOOL["bin"]


@pytest.mark.parametrize("name", ["qwen3-all", "llama-attention-bias", "gemma3-all"])
def test_integer_logits_follow_float(built, name):
    """Every bias is applied: the integer model's next-token choice agrees
    with the float reference's (which matches transformers, below) at every
    prompt position but near-ties, and its logits are close."""
    src, out = built[name]
    lm = load_model(out)
    li = Engine(lm, "cpu").new_state(64).forward(PROMPT, all_logits=True) / 2.0**16
    lf = FloatModel(read_source(src), np.float64, max_len=64).forward(np.array(PROMPT), 0)
    assert np.abs(li - lf).max() < 0.25, np.abs(li - lf).max()
    agree = (li.argmax(-1) == lf.argmax(-1)).sum()
    assert agree >= len(PROMPT) - 1


@pytest.mark.parametrize("name", ["qwen3-all", "llama-attention-bias", "gemma3-all"])
def test_float_reference_matches_transformers(built, name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    src = built[name][0]
    hf = transformers.AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0].double().numpy()
    got = FloatModel(read_source(src), np.float64, max_len=64).forward(np.array(PROMPT), 0)
    assert np.abs(got - want).max() < 1e-3
