"""Gemma 3 (Gemma3ForCausalLM, GGUF gemma3) end to end on tiny random models:
the block description it converts to, the float reference against
transformers, C++ against the numpy spec (every ISA and thread count, prefill
splits, batches), closeness to float, the GGUF path (Q5_0, 1 + w norms, the
values llama.cpp implies) and the refusals."""

import json
import os
import shutil

import numpy as np
import pytest

import models
from conftest import using_isa
from intdet import _core
from intdet.convert import convert
from intdet.convert.sources import read_source
from intdet.errors import IntdetError
from intdet.floatref import FloatModel
from intdet.model import Engine, load_model

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12, 64, 128, 3, 77]  # 12 tokens: longer than the window (5)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory, tiny_gemma3_hf):
    out = convert(tiny_gemma3_hf, str(tmp_path_factory.mktemp("gemma3") / "m"), progress=False)
    return tiny_gemma3_hf, load_model(out)


def run_all(engine, tokens, chunks):
    seq = engine.new_state(64)
    outs, i = [], 0
    for c in chunks:
        outs.append(seq.forward(tokens[i:i + c], all_logits=True))
        i += c
    return np.concatenate(outs)


def test_block_description(gemma):
    _, lm = gemma
    c = lm.cfg
    assert c["architecture"] == "gemma3" and c["residual_frac_bits"] == 10 and c["rope_local_theta"] == 10000.0
    assert [b["attention_window"] for b in c["layers"]] == [5, 0, 5]
    assert [b["rope"] for b in c["layers"]] == ["rope_local", "rope", "rope_local"]
    for b in c["layers"]:
        assert b["norms"] == ["attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"]
        assert b["qk_norm"] and b["activation"] == "gelu_tanh" and b["bias"] == []
    t = lm.tensors
    assert t["rope_local.cos"].shape == t["rope.cos"].shape and not np.array_equal(t["rope_local.cos"], t["rope.cos"])
    for n in ("post_attention_norm", "post_ffw_norm"):
        assert t[f"blk.1.{n}.g"].dtype == np.int16 and t[f"blk.1.{n}.shift"].shape == (1,)


def test_float_reference_matches_transformers(tiny_gemma3_hf):
    """FloatModel (1 + w folded at read, sqrt(H) embedding scale, window 5,
    two RoPE bases, query_pre_attn_scalar 40, GeGLU) equals transformers'
    Gemma3ForCausalLM on a prompt longer than the window."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_gemma3_hf, dtype=torch.float32).eval()
    assert type(hf).__name__ == "Gemma3ForCausalLM"
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0].double().numpy()
    got = FloatModel(read_source(tiny_gemma3_hf), np.float64, max_len=64).forward(np.array(PROMPT), 0)
    assert np.abs(got - want).max() < 1e-3


def test_cpp_matches_spec_bit_for_bit(gemma):
    _, lm = gemma
    cpu = run_all(Engine(lm, "cpu"), PROMPT, [len(PROMPT)])
    ref = run_all(Engine(lm, "ref"), PROMPT, [5, 1, 6])
    assert np.array_equal(cpu, ref)


def test_every_isa_and_thread_count(gemma, isa_threads):
    _, lm = gemma
    with using_isa("scalar", 1):
        want = run_all(Engine(lm, "cpu"), PROMPT, [len(PROMPT)])
    assert _core.isa() == isa_threads[0]
    assert np.array_equal(run_all(Engine(lm, "cpu"), PROMPT, [len(PROMPT)]), want), isa_threads


def test_prefill_splits_and_batches(gemma):
    _, lm = gemma
    eng = Engine(lm, "cpu")
    whole = run_all(eng, PROMPT, [len(PROMPT)])
    for chunks in ([1] * len(PROMPT), [7, 5], [4, 4, 4], [5, 1, 6]):
        assert np.array_equal(run_all(eng, PROMPT, chunks), whole), chunks
    # the prompt inside a batch of sequences of other lengths, prefill then decode
    others = [[9, 8, 7], list(range(20, 40)), [300]]
    prompts = others[:1] + [PROMPT] + others[1:]
    seqs = [eng.new_state(64) for _ in prompts]
    outs = eng.forward_batch(seqs, prompts, all_logits=True)
    assert np.array_equal(outs[1], whole)
    alone = eng.new_state(64)
    alone.forward(PROMPT)
    for step in range(8):  # decode past the window, batched
        toks = [[(31 * step + 7 * j) % 300] for j in range(len(prompts))]
        outs = eng.forward_batch(seqs, toks)
        assert np.array_equal(outs[1], alone.forward(toks[1])), step


def test_close_to_float_reference(gemma):
    """Integer logits against float64 on the same weights: RMS error under 4%
    of the logits' RMS, and the same top-1 at every position whose float
    top-2 margin is not a near-tie."""
    src, lm = gemma
    flt = FloatModel(read_source(src), np.float64, max_len=64)
    tokens = PROMPT + list(range(100, 124))
    li = run_all(Engine(lm, "cpu"), tokens, [len(tokens)]) / 65536.0
    lf = flt.forward(np.array(tokens), 0)
    rel = np.sqrt(np.mean((li - lf) ** 2) / np.mean(lf**2))
    assert rel < 0.04, rel
    top2 = np.sort(lf, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] >= 0.1
    assert clear.sum() >= len(tokens) - 4
    assert np.array_equal(np.argmax(li, -1)[clear], np.argmax(lf, -1)[clear])


def test_window_changes_the_logits(tmp_path, tiny_gemma3_hf):
    """A window as long as the context must give other logits than window 5
    past position 5 (the window is really applied), the same before it."""
    d = tmp_path / "hf"
    shutil.copytree(tiny_gemma3_hf, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["sliding_window"] = 4096
    (d / "config.json").write_text(json.dumps(cfg))
    wide = run_all(Engine(load_model(convert(str(d), str(tmp_path / "m"), progress=False))), PROMPT, [len(PROMPT)])
    narrow = run_all(Engine(load_model(convert(tiny_gemma3_hf, str(tmp_path / "n"), progress=False))), PROMPT,
                     [len(PROMPT)])
    assert np.array_equal(wide[:5], narrow[:5])
    assert not np.array_equal(wide[5:], narrow[5:])


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q5_0"])
def test_gguf(tmp_path, qtype):
    """A gemma3 GGUF (norms as 1 + w, tensor types incl. Q5_0) reads to the
    float model of its HF twin (the values llama.cpp implies: pattern 6,
    local base 10000, scale 1/sqrt(head_dim)), converts, and runs
    bit-identically on the C++ core and the spec."""
    path, cfg = models.write_gemma3_gguf(str(tmp_path / f"g-{qtype}.gguf"), qtype)
    hf_dir = models.write_hf_model(str(tmp_path / "hf"), "gemma3", **{k: v for k, v in cfg.items()
                                                                       if k not in ("architectures", "model_type")})
    fm = read_source(path)
    assert fm.arch == "gemma3" and fm.hp["attn_scale"] == 1 / np.sqrt(cfg["head_dim"])
    a = FloatModel(fm, np.float64, max_len=64).forward(np.array(PROMPT), 0)
    b = FloatModel(read_source(hf_dir), np.float64, max_len=64).forward(np.array(PROMPT), 0)
    tol = {"F32": 1e-4, "Q8_0": 0.5, "Q5_0": 1.5}[qtype]  # the block rounding of every matrix
    assert np.abs(a - b).max() < tol
    assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > (0.999 if qtype == "Q8_0" else 0.97)
    lm = load_model(convert(path, str(tmp_path / "m"), progress=False))
    assert np.array_equal(run_all(Engine(lm, "cpu"), PROMPT, [len(PROMPT)]), run_all(Engine(lm, "ref"), PROMPT, [7, 5]))


# ------------------------------------------------------------------ refusals

@pytest.mark.parametrize("key,value,words", [
    ("hidden_activation", "gelu", ["hidden_activation", "gelu_pytorch_tanh"]),
    ("final_logit_softcapping", 30.0, ["final_logit_softcapping", "soft-capping"]),
    ("attn_logit_softcapping", 50.0, ["attn_logit_softcapping"]),
    ("use_bidirectional_attention", True, ["use_bidirectional_attention"]),
    ("rope_scaling", {"rope_type": "linear", "factor": 8.0}, ["rope_scaling"]),
    ("layer_types", ["sliding_attention", "chunked_attention", "full_attention"], ["layer_types"]),
    ("sliding_window", -3, ["sliding_window"]),
])
def test_hf_config_refusals(tmp_path, tiny_gemma3_hf, key, value, words):
    d = tmp_path / "hf"
    shutil.copytree(tiny_gemma3_hf, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(IntdetError) as e:
        read_source(str(d))
    msg = str(e.value)
    assert "config.json" in msg and all(w in msg for w in words), msg


@pytest.mark.parametrize("edit,words", [
    (lambda c: c["layers"][0].update(activation="gelu"), ["layers[0].activation", "gelu_tanh"]),
    (lambda c: c["layers"][1].update(rope="rope_global"), ["layers[1].rope", "rope_local"]),
    (lambda c: c["layers"][2].update(norms=["attn_norm", "post_attention_norm", "ffn_norm"]), ["layers[2].norms"]),
    (lambda c: c["layers"][0].update(attention_window=-1), ["layers[0].attention_window"]),
    (lambda c: c.update(residual_frac_bits=30), ["residual_frac_bits"]),
    (lambda c: c.update(residual_frac_bits="10"), ["residual_frac_bits"]),
])
def test_loader_refusals(tmp_path, gemma, edit, words):
    """The one loader refuses a block feature or residual format it does not
    implement, naming the key (and a Gemma config edited to a Llama block
    misses or gains tensors: refused too)."""
    _, lm = gemma
    d = tmp_path / "m"
    shutil.copytree(lm.path, d)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(IntdetError) as e:
        load_model(str(d))
    assert all(w in str(e.value) for w in words), str(e.value)


def test_loader_refuses_post_norm_tensors_without_post_norms(tmp_path, gemma):
    _, lm = gemma
    d = tmp_path / "m"
    shutil.copytree(lm.path, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["layers"][0]["norms"] = ["attn_norm", "ffn_norm"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(IntdetError, match="post_attention_norm"):
        load_model(str(d))


def test_gguf_27b_shape_refused(tmp_path):
    """llama.cpp scales the 62-layer Gemma 3 by n_embd / n_head: refused, not guessed."""
    path, _ = models.write_gemma3_gguf(str(tmp_path / "g.gguf"), "F32", num_hidden_layers=62, hidden_size=32,
                                       intermediate_size=32, head_dim=32, num_attention_heads=1, vocab_size=320)
    with pytest.raises(IntdetError, match="27B"):
        read_source(path)
    assert os.path.exists(path)


def test_hash_check_float_matrix_on_gemma3(tiny_gemma3_hf, tmp_path):
    """hash-check --float on Gemma 3: every integer run agrees; the float
    runs are the numpy ones (torch_model implements Llama-style blocks only)."""
    import subprocess
    import sys

    env = dict(os.environ, INTDET_CACHE=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "intdet.cli", "hash-check", "-m", tiny_gemma3_hf, "--prompt", "hello world",
                        "--steps", "6", "--float", "--json"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["all_equal"]
    floats = [x["config"] for x in out["runs"] if x["group"] == "float"]
    assert floats and all(c.startswith("numpy float32") for c in floats)
    # the table says why there are no torch rows
    r = subprocess.run([sys.executable, "-m", "intdet.cli", "hash-check", "-m", tiny_gemma3_hf, "--prompt", "hello world",
                        "--steps", "2", "--float"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    last = r.stdout.rstrip().splitlines()[-1]
    assert last in ("(no torch float32 rows: torch's float reference does not run this architecture)",
                    "(no torch float32 rows: torch is not installed)"), last
