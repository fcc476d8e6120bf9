"""Model families against oracles no one here wrote, on tiny checkpoints
that transformers itself defines (tests/families.py): Llama 3 RoPE scaling,
linear RoPE scaling, Mistral (sliding window), Qwen2 / Qwen3 and their YaRN
long-context forms, Granite (multipliers), Phi-3 (fused projections),
OLMo 2 (post-norms only, projection-wide q/k RMSNorm), SmolLM3 (NoPE layers),
Qwen3-MoE and Mixtral (mixture of experts; more in test_moe.py).

Per family: the float reference equals transformers' forward; the integer
logits stay close to it (RMS, top-1, mean |delta logprob|, pinned bounds);
every kernel set and thread count gives the same bits as the scalar set; the
CUDA host emulator gives the same bits as the CPU; the greedy chain hash is
pinned; llama.cpp's own converter (tests/llamacpp_convert.py) writes GGUFs
that convert to the same integer model. Then the refusals."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import families
import llamacpp_convert
from conftest import using_isa
from intdet.convert import convert
from intdet.convert.sources import read_source
from intdet.errors import IntdetError
from intdet.floatref import FloatModel
from oracle import generate
from intdet.model import Engine, load_model

pytestmark = pytest.mark.slow

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12, 64, 128, 3, 77] + list(range(100, 136))  # 48 tokens: past window 7, orig ctx 32
FAMS = sorted(families.FAMILIES)
# Greedy chain hash of generate(PROMPT[:12], 8) on the integer model (CPU, any ISA).
GOLDEN = {
    "llama-linear": "11bf91dc3dc7", "llama3": "a53b4d82a911", "mistral": "01596055f2cc", "qwen2": "553c26c67d34",
    "qwen2-yarn": "df0dafb0b8e8", "qwen3": "1385167810a9", "qwen3-yarn": "e974d7f3aff6",
    "granite": "f2dabcd33711", "phi3": "9d9b815217ad", "olmo2": "dcdeb9d68dc3", "smollm3": "79dace081594",
    "qwen3-moe": "ea910d1978ff", "mixtral": "cdb13965ef28", "gemma2": "035b16009140",
}


@pytest.fixture(scope="module")
def fam(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            d = tmp_path_factory.mktemp(name)
            hf = families.write_family(name, str(d / "hf"))
            cache[name] = (hf, load_model(convert(hf, str(d / "int"), progress=False)))
        return cache[name]

    return get


def logprobs(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def int_logits(lm, tokens=PROMPT):
    return Engine(lm, "cpu").new_state(64).forward(tokens, all_logits=True)


@pytest.mark.parametrize("name", FAMS)
def test_float_reference_matches_transformers(fam, name):
    hf, _ = fam(name)
    want = families.hf_logits(hf, PROMPT)
    got = FloatModel(read_source(hf), np.float64, max_len=64).forward(np.array(PROMPT), 0)
    assert np.abs(got - want).max() < 1e-3


# Qwen3-MoE's 8 random experts: a row whose 2nd and 3rd router scores are
# within the integer error (~1.4% of them) takes another expert, whose output
# differs wholly (2-5 of 48 rows per layer here), and the change spreads
# through attention: measured rel RMS 0.15, top-1 0.92, mean |d logprob|
# 0.18. test_moe.py checks the MoE op itself to 3% where routing is clear.
LOOSE = {"qwen3-moe": dict(rms=0.2, top1=0.85, dlp=0.25)}


@pytest.mark.parametrize("name", FAMS)
def test_integer_close_to_transformers(fam, name):
    """RMS error under 4% of the logits' RMS, the same top-1 wherever the
    float top-2 margin is clear (0.5), mean |delta logprob| of the float top token
    under 0.08 (measured 0.03-0.05); LOOSE above for routing flips."""
    hf, lm = fam(name)
    tol = LOOSE.get(name, dict(rms=0.04, top1=1.0, dlp=0.08))
    want = families.hf_logits(hf, PROMPT)
    got = int_logits(lm) / 65536.0
    assert np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2)) < tol["rms"]
    top2 = np.sort(want, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] >= 0.5  # ~5x the integer logits' RMS error (~0.1 at std 4)
    assert clear.sum() >= len(PROMPT) // 2
    assert np.mean(got.argmax(-1)[clear] == want.argmax(-1)[clear]) >= tol["top1"]
    top = want.argmax(-1)
    rows = np.arange(len(PROMPT))
    assert np.abs(logprobs(got)[rows, top] - logprobs(want)[rows, top]).mean() < tol["dlp"]


def test_scaling_changes_the_tables(fam):
    """The scaled families really use their scaling: other cos/sin tables
    (and for YaRN another attention score scale) than plain RoPE."""
    for name, plain in (("llama3", None), ("qwen2-yarn", "qwen2"), ("qwen3-yarn", None)):
        _, lm = fam(name)
        assert lm.cfg["rope_scaling"]["type"] == {"llama3": "llama3"}.get(name, "yarn")
        if plain:
            _, lp = fam(plain)
            assert not np.array_equal(lm.tensors["rope.cos"], lp.tensors["rope.cos"])
            assert not np.array_equal(lm.tensors["blk.0.attn_score.mant"], lp.tensors["blk.0.attn_score.mant"])


@pytest.mark.parametrize("name", FAMS)
def test_every_isa_and_thread_count_same_bits(fam, name, isa_threads):
    _, lm = fam(name)
    with using_isa("scalar", 1):
        want = int_logits(lm)
    assert np.array_equal(int_logits(lm), want), isa_threads
    assert np.array_equal(Engine(lm, "ref").new_state(64).forward(PROMPT[:20], all_logits=True), want[:20])


@pytest.mark.parametrize("name", ["llama3", "mistral", "qwen3-yarn", "granite", "olmo2", "smollm3", "gemma2",
                                  "qwen3-moe", "mixtral"])
@pytest.mark.cuda
def test_cuda_emulator_same_bits(fam, name):
    """The CUDA kernels (host emulator) against the CPU: prefill, decode,
    chunks, batches (test_cuda._compare_model)."""
    from test_cuda import _compare_model, _emu_or_skip

    mod = _emu_or_skip()
    _, lm = fam(name)
    _compare_model(mod, lm, False, PROMPT[:12], 3, batch_co=2, ctx=64)


@pytest.mark.parametrize("name", FAMS)
def test_prefill_splits_and_golden_hash(fam, name):
    _, lm = fam(name)
    eng = Engine(lm, "cpu")
    whole = int_logits(lm)
    seq, outs = eng.new_state(64), []
    for a, b in ((0, 5), (5, 6), (6, 30), (30, len(PROMPT))):
        outs.append(seq.forward(PROMPT[a:b], all_logits=True))
    assert np.array_equal(np.concatenate(outs), whole)
    g = generate(eng, PROMPT[:12], 8)
    assert g.hash == generate(Engine(lm, "ref"), PROMPT[:12], 8).hash
    assert g.hash == GOLDEN[name]


@pytest.mark.parametrize("name", [f for f in FAMS if f != "mistral"])
def test_llamacpp_gguf_is_the_same_integer_model(fam, name, tmp_path):
    """llama.cpp's converter (f32) -> intdet: the tensors of the HF
    conversion, bit for bit; Llama 3's rope tables (from llama.cpp's float32
    rope_freqs factors) within one unit of Q14."""
    hf, lm = fam(name)
    g = llamacpp_convert.convert_hf_to_gguf(hf, str(tmp_path / "m.gguf"), "f32", pre=families.FAMILIES[name][2])
    lg = load_model(convert(g, str(tmp_path / "int"), progress=False))
    assert set(lg.tensors) == set(lm.tensors)
    for k, v in lm.tensors.items():
        if name == "llama3" and k.startswith("rope."):
            assert np.abs(v.astype(np.int32) - lg.tensors[k]).max() <= 1, k
        else:
            assert np.array_equal(v, lg.tensors[k]), k


@pytest.mark.parametrize("name,outtype", [("qwen3-yarn", "q8_0"), ("llama3", "bf16"), ("qwen2", "f16"),
                                          ("phi3", "q8_0"), ("olmo2", "bf16"), ("smollm3", "f16")])
def test_llamacpp_gguf_types_close(fam, name, outtype, tmp_path):
    hf, lm = fam(name)
    g = llamacpp_convert.convert_hf_to_gguf(hf, str(tmp_path / "m.gguf"), outtype, pre=families.FAMILIES[name][2])
    got = int_logits(load_model(convert(g, str(tmp_path / "int"), progress=False))) / 65536.0
    want = families.hf_logits(hf, PROMPT)
    assert np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2)) < 0.06


# ------------------------------------------------------------------ refusals

def _edited(src, tmp_path, **cfg_changes):
    d = tmp_path / "hf"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in cfg_changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


@pytest.mark.parametrize("rs,words", [
    (dict(rope_type="dynamic", factor=2.0), "'dynamic' is not supported (its frequencies depend on the sequence"),
    (dict(rope_type="longrope", short_factor=[1.0], long_factor=[1.0]), "'longrope' is not supported"),
    (dict(rope_type="su"), "'su' is not supported"),
    (dict(rope_type="ntk-by-parts"), "'ntk-by-parts' is not supported"),
    (dict(rope_type="linear"), "needs factor"),
    (dict(rope_type="linear", factor="4"), "factor = '4' must be a finite positive number"),
    (dict(rope_type="linear", factor=-1.0), "must be a finite positive number"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64, mscale=1.0, mscale_all_dim=1.0),
     "mscale"),
    (dict(rope_type="llama3", factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0,
          original_max_position_embeddings=32), "low_freq_factor must be below high_freq_factor"),
    ("linear", "is not an object"),
])
def test_hf_rope_scaling_refusals(fam, tmp_path, rs, words):
    hf, _ = fam("qwen2")
    d = _edited(hf, tmp_path, rope_scaling=rs, rope_parameters=None)
    out = tmp_path / "out"
    with pytest.raises(IntdetError, match="config.json") as e:
        convert(d, str(out), progress=False)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert not out.exists()


@pytest.mark.parametrize("family,change,words", [
    ("phi3", dict(rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0] * 12,
                                       long_factor=[1.0] * 12, original_max_position_embeddings=64)),
     "'longrope' is not supported"),
    ("phi3", dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.75)),
     "partial_rotary_factor = 0.75: partial RoPE is not supported"),
    ("granite", dict(residual_multiplier=-0.5), "residual_multiplier = -0.5 must be a finite positive number"),
    ("granite", dict(logits_scaling="8"), "logits_scaling = '8' must be a finite positive number"),
    ("smollm3", dict(no_rope_layers=[1, 0]), "no_rope_layers must list 4 entries of 1 (RoPE) or 0 (NoPE)"),
    ("smollm3", dict(no_rope_layers=None, no_rope_layer_interval=0), "no_rope_layer_interval = 0 must be a positive"),
    ("olmo2", dict(sliding_window=16), "OLMo 3's sliding layers are not supported"),
    ("gemma2", dict(attn_logit_softcapping=-50.0), "attn_logit_softcapping = -50.0 must be a positive number"),
    ("gemma2", dict(final_logit_softcapping=1e7), "final_logit_softcapping = 10000000.0 is outside [2^-16, 20000.0]"),
    ("gemma2", dict(rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=10000.0)),
     "RoPE scaling is not supported"),
])
def test_family_config_refusals(fam, tmp_path, family, change, words):
    hf, _ = fam(family)
    d = _edited(hf, tmp_path, **change)
    out = tmp_path / "out"
    with pytest.raises(IntdetError, match="config.json") as e:
        convert(d, str(out), progress=False)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert not out.exists()


def test_granite_multipliers_are_used(fam, tmp_path):
    """Each multiplier changes the model: without them transformers' own
    logits move far more than the integer error."""
    hf, lm = fam("granite")
    want = families.hf_logits(hf, PROMPT)
    for key, v in (("embedding_multiplier", 1.0), ("attention_multiplier", 0.15), ("residual_multiplier", 1.0),
                   ("logits_scaling", 1.0)):
        d = _edited(hf, tmp_path / key, **{key: v})
        other = families.hf_logits(d, PROMPT)
        assert np.sqrt(np.mean((other - want) ** 2) / np.mean(want**2)) > 0.1, key
        got = int_logits(load_model(convert(d, str(tmp_path / key / "int"), progress=False))) / 65536.0
        assert np.sqrt(np.mean((got - other) ** 2) / np.mean(other**2)) < 0.04, key


def test_gemma2_softcaps_are_used(fam, tmp_path):
    """Each soft-cap changes the model (transformers' logits move by more
    than 10% without it) and the integer model follows either way."""
    hf, _ = fam("gemma2")
    want = families.hf_logits(hf, PROMPT)
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        d = _edited(hf, tmp_path / key)
        cfg = json.loads(open(os.path.join(d, "config.json")).read())
        cfg[key] = None  # null: no cap (absent would be Gemma2Config's default)
        open(os.path.join(d, "config.json"), "w").write(json.dumps(cfg))
        other = families.hf_logits(d, PROMPT)
        assert np.sqrt(np.mean((other - want) ** 2) / np.mean(want**2)) > 0.1, key
        lm = load_model(convert(d, str(tmp_path / key / "int"), progress=False))
        assert ("output_softcap.cap" in lm.tensors) == (key != "final_logit_softcapping")
        assert ("blk.0.attn_softcap.cap" in lm.tensors) == (key != "attn_logit_softcapping")
        got = int_logits(lm) / 65536.0
        assert np.sqrt(np.mean((got - other) ** 2) / np.mean(other**2)) < 0.04, key


def test_mistral_bad_window_refused_by_the_cli(fam, tmp_path):
    hf, _ = fam("mistral")
    d = _edited(hf, tmp_path, sliding_window=-3)
    r = subprocess.run([sys.executable, "-m", "intdet.cli", "convert", d, "-o", str(tmp_path / "out")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "sliding_window = -3 must be a positive integer" in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()


def _rewrite_gguf(src, dst, drop=(), add_kv=(), replace_tensor=None):
    """Copy a GGUF with some keys dropped or added and one tensor's values replaced."""
    import gguf

    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in drop:
            continue
        v = f.contents()
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(k, v)
        else:
            w.add_key_value(k, v, vt)
    for k, v, vt in add_kv:
        w.add_key_value(k.replace("ARCH", arch), v, vt)
    for t in r.tensors:
        data = np.array(t.data)
        if replace_tensor and t.name == replace_tensor[0]:
            data = replace_tensor[1]
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_gguf_refusals(fam, tmp_path):
    """A rope_freqs tensor of the wrong length, YaRN with another
    extrapolation factor, an unknown scaling type: one-line errors naming
    the file, nothing written."""
    import gguf

    hf, _ = fam("llama3")
    g = llamacpp_convert.convert_hf_to_gguf(hf, str(tmp_path / "m.gguf"), "f32", pre="llama-bpe")
    cases = [
        (dict(replace_tensor=("rope_freqs.weight", np.ones(5, np.float32))), "'rope_freqs' must hold head_dim/2 = 24"),
        (dict(replace_tensor=("rope_freqs.weight", np.full(24, -1.0, np.float32))), "finite positive factors"),
        (dict(add_kv=[("ARCH.rope.scaling.type", "longrope", gguf.GGUFValueType.STRING)]),
         "rope scaling 'longrope' is not supported"),
    ]
    hq, _ = fam("qwen2-yarn")
    gy = llamacpp_convert.convert_hf_to_gguf(hq, str(tmp_path / "y.gguf"), "f32", pre="qwen2")
    for i, (kw, words) in enumerate(cases):
        bad = _rewrite_gguf(g, str(tmp_path / f"bad{i}.gguf"), **kw)
        with pytest.raises(IntdetError) as e:
            convert(bad, str(tmp_path / f"o{i}"), progress=False)
        assert words in str(e.value) and bad in str(e.value), str(e.value)
        assert not (tmp_path / f"o{i}").exists()
    ho, _ = fam("olmo2")
    go = llamacpp_convert.convert_hf_to_gguf(ho, str(tmp_path / "o.gguf"), "f32", pre="llama-bpe")
    bad = _rewrite_gguf(go, str(tmp_path / "swa.gguf"), add_kv=[("ARCH.attention.sliding_window", 16,
                                                                  gguf.GGUFValueType.UINT32)])
    with pytest.raises(IntdetError, match="olmo2.attention.sliding_window: OLMo 3's sliding-window layers"):
        convert(bad, str(tmp_path / "os"), progress=False)
    bad = _rewrite_gguf(gy, str(tmp_path / "ext.gguf"), drop=("qwen2.rope.scaling.yarn_ext_factor",),
                        add_kv=[("ARCH.rope.scaling.yarn_ext_factor", 0.5, gguf.GGUFValueType.FLOAT32)])
    with pytest.raises(IntdetError, match="yarn_ext_factor 0.5 is not supported"):
        convert(bad, str(tmp_path / "oe"), progress=False)
    assert os.path.exists(gy)
