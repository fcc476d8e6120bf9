"""scripts/torch_decode.py, the device check's fp16 torch baseline (issue 50),
checked on the CPU in float32 without graphs: its prefill and static-cache
decode give Hugging Face transformers' logits on the tiny Llama (with Llama
3 rope scaling) and Qwen3 checkpoints, and the script writes its rows."""

import json
import os
import subprocess
import sys

import models
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import torch_decode as td  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LLAMA3_SCALING = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=64)  # short enough that the tiny heads' frequencies are scaled


@pytest.fixture(scope="module", params=["llama3", "qwen3"])
def hf_dir(request, tmp_path_factory):
    d = str(tmp_path_factory.mktemp(request.param))
    if request.param == "llama3":
        return models.write_hf_model(d, "llama", rope_scaling=LLAMA3_SCALING, rope_theta=500000.0)
    return models.write_hf_model(d, "qwen3")


def _hf_last_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor(ids)).logits[:, -1].float()


def test_llama3_rope_scaling_changes_the_frequencies():
    cfg = {"head_dim": 48, "hidden_size": 144, "num_attention_heads": 3, "rope_theta": 500000.0}
    plain = td.inv_freq(cfg)
    scaled = td.inv_freq(dict(cfg, rope_scaling=LLAMA3_SCALING))
    assert torch.equal(plain[:2], scaled[:2])  # wavelengths under 64 / 4 stay
    assert torch.allclose(scaled[-1], plain[-1] / 8)  # long ones are divided by the factor
    with pytest.raises(SystemExit, match="yarn"):
        td.inv_freq(dict(cfg, rope_scaling={"rope_type": "yarn", "factor": 4.0}))


def test_prefill_and_decode_match_transformers(hf_dir):
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    cfg = td.load_config(hf_dir)
    m = td.Decoder(cfg, td.load_weights(hf_dir, torch.float32, "cpu"), 192)
    g = torch.Generator().manual_seed(1)
    V = cfg["vocab_size"]
    prompt = torch.randint(0, V, (1, 70), generator=g)  # past original_max_position_embeddings (64)
    cache = m.new_cache(3, 70 + 5)
    with torch.inference_mode():
        got = m.prefill(prompt, cache, 0)
        ref = _hf_last_logits(hf, prompt.tolist())
        assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4), (got - ref).abs().max()
        for kc, vc in cache:  # as bench_decode: the prompt's K/V shared by every row
            kc[1:, :, :70] = kc[:1, :, :70]
            vc[1:, :, :70] = vc[:1, :, :70]
        seqs = [prompt[0].tolist() for _ in range(3)]
        pos = torch.tensor([70])
        for _ in range(3):  # three steps, the rows on different tokens
            tok = torch.randint(0, V, (3, 1), generator=g)
            got = m.decode(tok, pos, cache)
            for r in range(3):
                seqs[r].append(int(tok[r, 0]))
                ref = _hf_last_logits(hf, [seqs[r]])[0]
                assert torch.allclose(got[r], ref, atol=1e-4, rtol=1e-4), (r, (got[r] - ref).abs().max())
            pos.add_(1)


def test_script_writes_rows_on_cpu(tmp_path, tiny_qwen3_hf):
    rows = tmp_path / "rows.jsonl"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "torch_decode.py"), tiny_qwen3_hf, str(rows),
                        "--model", "qwen3-0.6b", "--device", "cpu", "--batches", "1,2", "--prompt", "8",
                        "--steps", "2", "--prefill", "16"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [(x["engine"], x["phase"], x["batch"], x["tokens"]) for x in got] == [
        ("torch", "decode", 1, 8), ("torch", "decode", 2, 8), ("torch", "prefill", 1, 16)]
    assert all(x["tok_s"] > 0 for x in got)


def test_other_architectures_are_refused(tmp_path, tiny_qwen2_hf):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "torch_decode.py"), tiny_qwen2_hf,
                        str(tmp_path / "rows.jsonl"), "--model", "qwen3-0.6b", "--device", "cpu"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "model_type 'qwen2' is not llama or qwen3" in r.stderr
    assert "Traceback" not in r.stderr
