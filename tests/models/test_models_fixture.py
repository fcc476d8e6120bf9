"""Checks of the synthetic test checkpoints in tests/models.py."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import models

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ------------------------------------------------------------------ PRNG

def test_splitmix64_reference_values():
    # Vigna's splitmix64.c with x = 0: the published first outputs.
    assert models.splitmix64(0, 3) == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert models.splitmix64(42, 2) == [0xBDD732262FEB6E95, 0x28EFE333B266F103]


def test_splitmix64_numpy_matches_python_ints():
    ref = models.splitmix64(0xDEADBEEFCAFEF00D, 300)
    assert [int(v) for v in models.splitmix64_np(0xDEADBEEFCAFEF00D, 0, 300)] == ref
    assert [int(v) for v in models.splitmix64_np(0xDEADBEEFCAFEF00D, 123, 50)] == ref[123:173]


def test_prng_normal_pinned():
    x = models.prng_normal_like(0, (6,))
    assert x.dtype == np.float32
    assert [hex(int(v)) for v in x.view(np.uint32)] == [
        "0x3fb6dd01", "0x3e0e7cfd", "0xbfba0346", "0x3f8f434f", "0xbf811e75", "0x3d8e1511"]
    y = models.prng_normal_like(123, (2, 2), std=0.02, mean=1.0)
    assert [hex(int(v)) for v in y.reshape(-1).view(np.uint32)] == ["0x3f7f9c10", "0x3f83dc1a", "0x3f85cb28", "0x3f7e01c6"]
    assert models.name_seed(0, "model.embed_tokens.weight") == 0x1ACB025CF390DC05
    # chunks of a stream concatenate to the whole stream
    whole = models.prng_normal_like(5, (1000,), 0.3)
    parts = np.concatenate([models.prng_normal_like(5, (n,), 0.3, offset=o) for o, n in ((0, 333), (333, 667))])
    assert np.array_equal(whole, parts)
    big = models.prng_normal_like(9, (200_000,))
    assert abs(float(big.mean())) < 0.01 and abs(float(big.std()) - 1.0) < 0.01


def test_bf16_rounding_is_nearest_even():
    a = np.array([1.0, 1.00390625, 1.01171875, -2.5], np.float32)
    assert models.f32_to_bf16_bits(a).tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020]


# --------------------------------------------------------------- HF dirs

def _load_and_run(path, n_tokens=9):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    ids = torch.tensor([[1, 120, 118, 262, 13, 87, 260, 280, 2][:n_tokens]])
    with torch.no_grad():
        logits = model(ids).logits[0].float().numpy()
    return model, logits


@pytest.mark.parametrize("fixture,arch", [("tiny_llama_hf", "llama"), ("tiny_qwen2_hf", "qwen2"), ("tiny_qwen3_hf", "qwen3")])
def test_hf_dir_loads_in_transformers(request, fixture, arch):
    path = request.getfixturevalue(fixture)
    model, logits = _load_and_run(path)
    cfg = models.hf_config(arch)
    assert logits.shape == (9, cfg["vocab_size"])
    assert np.all(np.isfinite(logits))
    assert logits.std() > 0.5 and len(set(logits.argmax(-1).tolist())) > 3  # non-trivial, varied
    # transformers holds exactly our weights (nothing re-initialised)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    want = models.hf_weights(cfg)
    for name, w in want.items():
        assert np.array_equal(sd[name], w), name
    lm = sd["lm_head.weight"]
    assert np.array_equal(lm, want["lm_head.weight" if "lm_head.weight" in want else "model.embed_tokens.weight"])
    assert ("lm_head.weight" in want) == (arch == "llama")


def test_hf_bf16_and_overrides(tmp_path):
    import torch

    rs = {"rope_type": "linear", "factor": 2.0}
    path = models.write_hf_model(str(tmp_path / "m"), "qwen3", dtype="bfloat16", num_hidden_layers=2, rope_scaling=rs)
    cfg = json.load(open(os.path.join(path, "config.json")))
    assert cfg["torch_dtype"] == "bfloat16" and cfg["num_hidden_layers"] == 2 and cfg["rope_scaling"] == rs
    model, logits = _load_and_run(path)
    assert np.all(np.isfinite(logits))
    q = model.state_dict()["model.layers.1.self_attn.q_proj.weight"]
    assert q.dtype == torch.bfloat16
    want = models.f32_to_bf16_bits(models.hf_weights(models.hf_config("qwen3"))["model.layers.1.self_attn.q_proj.weight"])
    assert np.array_equal(q.view(torch.int16).numpy().view(np.uint16), want)


def test_tokenizer_files(tiny_qwen3_hf):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = Tokenizer.from_file(os.path.join(tiny_qwen3_hf, "tokenizer.json"))
    assert [tok.token_to_id(t) for t in models.SPECIAL_TOKENS] == [0, 1, 2]
    assert tok.get_vocab_size() == models.TOKENIZER_SIZE <= models.hf_config("qwen3")["vocab_size"]
    text = "<|im_start|>user\nThe cat and the dog, with 42 émojis 🙂<|im_end|>"
    enc = tok.encode(text)
    assert enc.ids[0] == 1 and enc.ids[-1] == 2 and "Ġand" in enc.tokens
    assert tok.decode(enc.ids, skip_special_tokens=False) == text
    hft = AutoTokenizer.from_pretrained(tiny_qwen3_hf)
    s = hft.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert s == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert hft.eos_token == "<|im_end|>" and hft("hi")["input_ids"] == tok.encode("hi").ids  # no BOS added


def test_write_hf_model_is_byte_identical(tmp_path, tiny_llama_hf):
    a = models.write_hf_model(str(tmp_path / "a"), "llama")
    for f in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert _sha256(os.path.join(a, f)) == _sha256(os.path.join(tiny_llama_hf, f)), f
    # pinned: the same bytes on every machine / numpy version (change deliberately only)
    assert _sha256(os.path.join(a, "model.safetensors")) == "64fedce6321ef5c7ee4c6ab121d4171ea31b6a8e7abdaa6b66af4af01c188d53"
    other = models.write_hf_model(str(tmp_path / "b"), "llama", seed=1)
    assert _sha256(os.path.join(other, "model.safetensors")) != _sha256(os.path.join(a, "model.safetensors"))


def test_make_random_model_script_tiny(tmp_path, tiny_qwen3_hf):
    out = tmp_path / "s"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_random_model.py"), str(out), "--shape", "tiny-qwen3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert _sha256(out / "model.safetensors") == _sha256(os.path.join(tiny_qwen3_hf, "model.safetensors"))


# ------------------------------------------------------------------ GGUF

def _gguf_tensors(path):
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        out[t.name] = (t.tensor_type.name, dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape))
    return r, out


def test_gguf_fixture_matches_hf_twin(tiny_llama_gguf, tiny_llama_hf):
    r, ts = _gguf_tensors(tiny_llama_gguf)
    f = lambda k: r.fields[k].contents()  # noqa: E731
    cfg, hw = models.hf_twin_of_gguf("F32")
    assert f("general.architecture") == "llama"
    assert f("llama.embedding_length") == 72 and f("llama.attention.head_count") == 3
    assert f("llama.attention.head_count_kv") == 1 and f("llama.attention.key_length") == 48
    assert f("llama.rope.dimension_count") == 48 and f("llama.block_count") == 3
    assert f("tokenizer.ggml.model") == "gpt2" and f("tokenizer.ggml.add_bos_token") is False
    toks = f("tokenizer.ggml.tokens")
    assert len(toks) == 320 and toks[:3] == models.SPECIAL_TOKENS and f("tokenizer.ggml.token_type")[:4] == [3, 3, 3, 1]
    assert f("tokenizer.ggml.merges")[0] == "Ġ t" and f("tokenizer.ggml.eos_token_id") == 2
    assert len(ts) == 2 + 3 * 9 + 1
    # the HF twin is the same model as the tiny_llama_hf fixture
    from safetensors.numpy import load_file
    assert all(np.array_equal(v, hw[k]) for k, v in load_file(os.path.join(tiny_llama_hf, "model.safetensors")).items())
    for i in range(3):
        q = ts[f"blk.{i}.attn_q.weight"][1]
        hq = hw[f"model.layers.{i}.self_attn.q_proj.weight"]
        assert np.array_equal(_unpermute(q, 3), hq)
        assert np.array_equal(_unpermute(ts[f"blk.{i}.attn_k.weight"][1], 1), hw[f"model.layers.{i}.self_attn.k_proj.weight"])
        # llama.cpp layout: row 2j / 2j+1 of a head are HF rows j / j + head_dim/2 (rotary pairs)
        assert np.array_equal(q[48 + 2 * 5], hq[48 + 5]) and np.array_equal(q[48 + 2 * 5 + 1], hq[48 + 24 + 5])
        assert np.array_equal(ts[f"blk.{i}.ffn_down.weight"][1], hw[f"model.layers.{i}.mlp.down_proj.weight"])
    assert np.array_equal(ts["output.weight"][1], hw["lm_head.weight"])
    assert np.array_equal(ts["token_embd.weight"][1], hw["model.embed_tokens.weight"])


# max |dequant - w| / max|w| per row, for a row of ~N(0, s^2) values
TOL = {"F32": 0.0, "F16": 1e-3, "BF16": 4e-3, "Q8_0": 8e-3, "Q4_0": 0.15, "Q4_1": 0.09,
       "Q4_K": 0.09, "Q5_K": 0.045, "Q6_K": 0.025}


@pytest.mark.parametrize("qtype", list(models.QTYPE_PRESET))
def test_gguf_qtypes(tmp_path, qtype):
    path = models.write_gguf_model(str(tmp_path / f"m-{qtype}.gguf"), qtype)
    r, ts = _gguf_tensors(path)
    cfg, hw = models.hf_twin_of_gguf(qtype)
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    assert r.fields["llama.embedding_length"].contents() == cfg["hidden_size"]
    for i in range(cfg["num_hidden_layers"]):
        assert ts[f"blk.{i}.attn_norm.weight"][0] == "F32" and ts[f"blk.{i}.ffn_norm.weight"][0] == "F32"
        for g, h, n in (("attn_q", "self_attn.q_proj", nh), ("attn_k", "self_attn.k_proj", nkv),
                        ("attn_v", "self_attn.v_proj", None), ("ffn_down", "mlp.down_proj", None)):
            typ, w = ts[f"blk.{i}.{g}.weight"]
            assert typ == qtype
            w = _unpermute(w, n) if n else w
            ref = hw[f"model.layers.{i}.{h}.weight"]
            err = np.abs(w - ref).max(axis=1) / np.abs(ref).max(axis=1)
            assert err.max() <= TOL[qtype], (g, float(err.max()))
    assert ts["output_norm.weight"][0] == "F32"
