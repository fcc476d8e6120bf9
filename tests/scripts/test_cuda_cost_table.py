"""scripts/cuda_cost_table.py: the per-kernel byte arithmetic of a decode token
against independent counts (a converted model's tensors, the engine's launch
and KV formulas), and the SASS columns on the built CUDA module."""

import importlib.util
import os
import sys

import models
import numpy as np
import pytest

from intdet.convert import convert
from intdet.model import load_model

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("cuda_cost_table",
                                              os.path.join(HERE, "..", "..", "scripts", "cuda_cost_table.py"))
cct = importlib.util.module_from_spec(spec)
sys.modules["cuda_cost_table"] = cct  # dataclasses look their module up there
spec.loader.exec_module(cct)
check_sass = cct.check_sass

LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A converted qwen3 (tied embeddings) with distinct sizes per dimension."""
    d = tmp_path_factory.mktemp("cost")
    src = models.write_hf_model(str(d / "hf"), "qwen3", hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1280)
    return load_model(convert(src, str(d / "int"), progress=False))


def _cfg(lm):
    return {k: lm.cfg[k] for k in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                                   "num_layers", "vocab_size")}


@pytest.mark.parametrize("variant", ["before", "after"])
def test_weight_bytes_per_token_equal_the_models_tensors(wide, variant):
    """Every int8 weight matrix a token needs (the lm_head: the tied embedding)
    is read exactly once per token, with its per-channel mant and shift."""
    t = wide.tensors
    L = wide.cfg["num_layers"]
    head = "output" if "output.q" in t else "tok_embd"
    mats = [f"blk.{i}.{n}" for i in range(L) for n in LINEARS] + [head]
    tot = cct.token_totals(cct.decode_calls(_cfg(wide), 40, variant))
    assert tot["w_int8"] == sum(np.asarray(t[m + ".q"]).nbytes for m in mats)
    scales = sum(np.asarray(t[m + s]).nbytes for m in mats for s in (".mant", ".shift"))
    gammas = sum(np.asarray(v).nbytes for k, v in t.items() if k.endswith(".g"))
    H, D = wide.cfg["hidden_size"], wide.cfg["head_dim"]
    rope_row = 2 * np.asarray(t["rope.cos"])[0].nbytes
    assert np.asarray(t["rope.cos"]).shape[1] * 2 == D
    # other weights: scales, gammas (q/k norm per layer; attn/ffn norm per layer; the output norm),
    # a RoPE row per layer, the embedding row with its mant and shift
    assert tot["w_other"] == scales + gammas + L * rope_row + H + 8


def test_qwen3_0_6b_token_bytes_and_launches():
    """596 MB of int8 weights (Qwen3-0.6B's 0.44 B non-embedding + 0.16 B lm_head
    parameters); 6 L + 4 = 172 launches before, 5 L + 3 = 143 after (the
    emulator's launch_count test, decode_launches in tests/engine/test_cuda.py)."""
    per_layer = 2048 * 1024 + 2 * 1024 * 1024 + 1024 * 2048 + 3 * 3072 * 1024
    for v, launches in (("before", 6 * 28 + 4), ("after", 5 * 28 + 3)):
        tot = cct.token_totals(cct.decode_calls(cct.QWEN3_06B, 512, v))
        assert tot["w_int8"] == 28 * per_layer + 151936 * 1024 == 595_984_384
        assert tot["launches"] == launches
    assert (172, 143) == tuple(cct.token_totals(cct.decode_calls(cct.QWEN3_06B, 512, v))["launches"]
                               for v in cct.VARIANTS)


@pytest.mark.parametrize("pos", [0, 1, 511, 2047])
def test_kv_bytes_are_the_engines_attention_bytes(pos):
    """After: the fused kernel reads pos cached positions and appends one:
    n (2 D + 8) bytes per kv head, the profile's attn_bytes formula
    (engine_forward.cpp); before: the split reads the own position's V row and
    scale back from the cache (D + 4 per kv head), the fused kernel keeps them."""
    c = cct.QWEN3_06B
    n, nkv, D, L = pos + 1, c["num_kv_heads"], c["head_dim"], c["num_layers"]
    after = cct.token_totals(cct.decode_calls(c, pos, "after"))
    before = cct.token_totals(cct.decode_calls(c, pos, "before"))
    assert after["kv"] == L * n * nkv * (2 * D + 8)
    assert before["kv"] == after["kv"] + L * nkv * (D + 4)
    # the split's score rows (int32 per head and position) go through global memory; the fused kernel's do not
    assert before["scratch"] >= L * 8 * c["num_heads"] * n * 4
    assert before["scratch"] > after["scratch"] == L * 4 * c["num_heads"] * D  # the fused quant16's re-read


def test_split_chunk_is_the_before_builds():
    assert cct.attn_chunk(768, 8) == 32  # 513 positions, 8 kv heads: 17 chunks of 32
    assert cct.attn_chunk(4096, 8) == 128
    assert cct.attn_chunk(1 << 20, 1) == 512


def test_bad_config_and_arguments_are_named():
    bad = dict(cct.QWEN3_06B, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_kv_heads"):
        cct.decode_calls(bad, 5, "after")
    with pytest.raises(ValueError, match="pos"):
        cct.decode_calls(cct.QWEN3_06B, -1, "after")
    with pytest.raises(ValueError, match="variant"):
        cct.decode_calls(cct.QWEN3_06B, 5, "now")


def test_arguments_are_checked_before_any_work(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        cct.main(["--pos", "-3", "--no-sass"])
    assert e.value.code == 2 and "--pos" in capsys.readouterr().err
    assert cct.main(["--before", str(tmp_path / "none.so"), "--no-sass"]) == 2
    assert "--before" in capsys.readouterr().err


def test_markdown_without_sass(tmp_path, capsys):
    out = tmp_path / "t.md"
    assert cct.main(["--no-sass", "--pos", "512", "--markdown", str(out)]) == 0
    md = out.read_text()
    assert "| **token** | | 172 / 143 |" in md
    assert "| lm_head GEMV | `gemv_kernel<1>` / `gemv_kernel<1, false>` | 1 / 1 | 157.4 / 157.4 |" in md
    assert "n/a" in md and "attn_pv_kernel` / - |" in md
    assert "tok/s at 3.35 TB/s (H100)" in md
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


AFTER = check_sass.built_module()


@pytest.mark.skipif(not check_sass.tools_available() or not AFTER, reason="needs cuobjdump/nvdisasm and intdet._cuda")
def test_runs_on_the_built_module(tmp_path, capsys):
    """The built module is the AFTER build: each role's kernel is found in its
    sm_90 SASS, and taking it for the BEFORE build fails naming the kernel
    it lacks (the name mapping is checked, not assumed)."""
    funcs = cct.sass_per_function(AFTER)
    for sym in ("embed", "norm_quant16", "gemv_staged", "gemv_plain", "attn_fused"):
        assert cct.sass_of(funcs, sym, AFTER) > 50
    assert "attn_fused_kernel" in cct.kernel_base_names(funcs)
    out = tmp_path / "t.md"
    assert cct.main(["--after", AFTER, "--markdown", str(out)]) == 0
    md = out.read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| attention (before"))
    assert row.endswith(f"| n/a / {cct.sass_of(funcs, 'attn_fused', AFTER)} |")
    capsys.readouterr()
    assert cct.main(["--before", AFTER, "--after", AFTER]) == 2
    assert "gemv_before" in capsys.readouterr().err
