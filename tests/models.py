"""Tiny synthetic checkpoints for tests.

The Hugging Face checkpoints, their PRNG and their tokenizer are
intdet.random_model (one definition, shared with `intdet random-model`),
re-exported here; this file adds the GGUF versions of the same weights.
Everything is byte-identical on every machine and numpy version.

Sizes chosen:
  HF tiny (all archs): hidden 72 (not a multiple of 16), intermediate 136,
      3 layers, 3 heads, 1 kv head (GQA), head_dim 48, vocab 320.
  GGUF "tiny"  (F32/F16/BF16):    same sizes as HF tiny llama.
  GGUF "q32"   (Q8_0/Q4_0/Q4_1):  hidden 96, intermediate 160, head_dim 32
      (every matrix row length is a multiple of the 32-wide block).
  GGUF "q256"  (Q4_K/Q5_K/Q6_K):  hidden 256, intermediate 512, 2 layers,
      2 heads, 1 kv head, head_dim 128 (rows multiple of 256).
"""

from __future__ import annotations

import numpy as np

from intdet.random_model import (  # noqa: F401  (re-exported for the tests)
    ARCH_CLASS,
    BOS_ID,
    CHAT_TEMPLATE,
    EOS_ID,
    GAMMA,
    MASK64,
    MERGES,
    QWEN3_0_6B,
    SPECIAL_TOKENS,
    TINY,
    TOKENIZER_SIZE,
    byte_symbols,
    f32_to_bf16_bits,
    hf_config,
    hf_weights,
    make_tokenizer,
    name_seed,
    prng_normal_like,
    splitmix64,
    splitmix64_np,
    tensor_specs,
    tensor_values,
    vocab_list,
    write_hf_model,
    write_safetensors,
    write_tokenizer_files,
)

# ------------------------------------------------------------------ GGUF

GGUF_PRESETS = {
    "tiny": {},
    "q32": dict(hidden_size=96, intermediate_size=160, head_dim=32),
    "q256": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=128),
}
# Shape of the int4 test models (--weights int4 needs linear inputs that are multiples of 32).
INT4_SHAPE = GGUF_PRESETS["q32"]
QTYPE_PRESET = {"F32": "tiny", "F16": "tiny", "BF16": "tiny", "Q8_0": "q32", "Q4_0": "q32", "Q4_1": "q32",
                "Q4_K": "q256", "Q5_K": "q256", "Q6_K": "q256"}


def gguf_shape(qtype: str) -> dict:
    """Config overrides of the llama model a GGUF of `qtype` is made from:
    write_hf_model(d, "llama", **gguf_shape(q)) writes its HF twin."""
    return dict(GGUF_PRESETS[QTYPE_PRESET[qtype]])


def hf_twin_of_gguf(qtype: str = "F32", seed: int = 0):
    """(config dict, HF name -> float32 weights) that write_gguf_model(qtype,
    seed) quantizes: HF orientation, Q/K rows NOT permuted."""
    cfg = hf_config("llama", **gguf_shape(qtype))
    return cfg, hf_weights(cfg, seed)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF split-half
    RoPE rows -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _f16(x):
    return x.astype(np.float16)


def _safe_div(a, b):
    return np.where(b > 0, a / np.where(b > 0, b, 1), 0).astype(np.float32)


def _k_affine(x, nmax):
    """Scale/min of Q4_K/Q5_K sub-blocks (x: [nb, 8, 32]): simple min/max
    fit, 6-bit sub-scales, f16 super-scales; returns packed pieces and q."""
    lo = np.minimum(x.min(-1), 0).astype(np.float32)
    scale = ((x.max(-1) - lo) / np.float32(nmax)).astype(np.float32)
    mins = -lo
    d, dmin = _f16(scale.max(-1) / np.float32(63)), _f16(mins.max(-1) / np.float32(63))
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.ceil(_safe_div(scale, d32)), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(_safe_div(mins, dmin32)), 0, 63).astype(np.uint8)
    eff_s, eff_m = (d32 * sc).astype(np.float32)[..., None], (dmin32 * m).astype(np.float32)[..., None]
    q = np.clip(np.rint(_safe_div(x + eff_m, eff_s)), 0, nmax).astype(np.uint8)
    scales = np.concatenate([
        (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6),
        (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6),
        (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)], axis=1).astype(np.uint8)
    head = np.concatenate([d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8), scales], axis=1)
    return head, q


def quantize_k(w: np.ndarray, qtype: str) -> np.ndarray:
    """Q4_K / Q5_K / Q6_K blocks ([rows, bytes] uint8) in ggml's layout.
    gguf-py 0.19 only dequantizes K-quants, so this is a plain min/max
    quantizer (not llama.cpp's error search); float32 elementwise ops and
    exact min/max only, so it is deterministic too."""
    rows = w.shape[0]
    x = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, 256)
    nb = x.shape[0]
    if qtype in ("Q4_K", "Q5_K"):
        head, q = _k_affine(x.reshape(nb, 8, 32), 15 if qtype == "Q4_K" else 31)
        qs = ((q[:, 0::2] & 15) | ((q[:, 1::2] & 15) << 4)).reshape(nb, 128)
        if qtype == "Q4_K":
            out = np.concatenate([head, qs], axis=1)
        else:
            qh = np.zeros((nb, 32), np.uint8)
            for j in range(8):  # bit j of qh[l] is bit 4 of sub-block j, element l
                qh |= ((q[:, j] >> 4) & 1) << j
            out = np.concatenate([head, qh, qs], axis=1)
    elif qtype == "Q6_K":
        xs = x.reshape(nb, 16, 16)
        scale = (np.abs(xs).max(-1) / np.float32(31)).astype(np.float32)
        d = _f16(scale.max(-1) / np.float32(127))
        d32 = d.astype(np.float32)[:, None]
        sc = np.clip(np.ceil(_safe_div(scale, d32)), 0, 127).astype(np.int8)
        eff = (d32 * sc).astype(np.float32)[..., None]
        u = (np.clip(np.rint(_safe_div(xs, eff)), -32, 31) + 32).astype(np.uint8).reshape(nb, 2, 2, 64)
        ql = (u[:, :, 0] & 15) | ((u[:, :, 1] & 15) << 4)  # element h*128+nib*64+l -> ql[h*64+l] nibble nib
        hi = (u >> 4).reshape(nb, 2, 4, 32)  # element h*128+s*32+l -> qh[h*32+l] bits 2s..2s+1
        qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
        out = np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8),
                              d.reshape(-1, 1).view(np.uint8)], axis=1)
    else:
        raise ValueError(qtype)
    return np.ascontiguousarray(out.astype(np.uint8).reshape(rows, -1))


def quantize_matrix(w: np.ndarray, qtype: str):
    """(array for GGUFWriter.add_tensor, raw_dtype or None)."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import quantize

    if qtype in ("Q4_K", "Q5_K", "Q6_K"):
        return quantize_k(w, qtype), T[qtype]
    q = quantize(np.ascontiguousarray(w, dtype=np.float32), T[qtype])
    return q, (T[qtype] if q.dtype == np.uint8 else None)


FILE_TYPE = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16", "Q8_0": "MOSTLY_Q8_0",
             "Q4_0": "MOSTLY_Q4_0", "Q4_1": "MOSTLY_Q4_1", "Q4_K": "MOSTLY_Q4_K_M",
             "Q5_K": "MOSTLY_Q5_K_M", "Q6_K": "MOSTLY_Q6_K"}


def write_gguf_model(path: str, qtype: str = "F32", seed: int = 0) -> str:
    """A llama GGUF as llama.cpp's convert_hf_to_gguf.py would make from
    hf_twin_of_gguf(qtype, seed): Q/K rows permuted, 2-D tensors in `qtype`,
    1-D norms F32, gpt2 byte-level tokenizer metadata."""
    import gguf

    if qtype not in QTYPE_PRESET:
        raise ValueError(f"qtype must be one of {list(QTYPE_PRESET)}, not {qtype!r}")
    cfg, hw = hf_twin_of_gguf(qtype, seed)
    H, nh, nkv, D, V = (cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"))
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("intdet-tiny-llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(D)  # the converter writes these when config.json has head_dim
    w.add_value_length(D)
    w.add_rope_dimension_count(D)
    w.add_vocab_size(V)
    w.add_file_type(gguf.LlamaFileType[FILE_TYPE[qtype]])
    if qtype not in ("F32", "F16", "BF16"):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_gpt2_tokenizer(w, V)
    w.add_chat_template(CHAT_TEMPLATE)

    def mat(name, arr):
        data, raw = quantize_matrix(arr, qtype)
        w.add_tensor(name, data, raw_dtype=raw)

    mat("token_embd.weight", hw["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", hw[p + "input_layernorm.weight"])
        mat(b + "attn_q.weight", permute_qk(hw[p + "self_attn.q_proj.weight"], nh))
        mat(b + "attn_k.weight", permute_qk(hw[p + "self_attn.k_proj.weight"], nkv))
        mat(b + "attn_v.weight", hw[p + "self_attn.v_proj.weight"])
        mat(b + "attn_output.weight", hw[p + "self_attn.o_proj.weight"])
        w.add_tensor(b + "ffn_norm.weight", hw[p + "post_attention_layernorm.weight"])
        mat(b + "ffn_gate.weight", hw[p + "mlp.gate_proj.weight"])
        mat(b + "ffn_up.weight", hw[p + "mlp.up_proj.weight"])
        mat(b + "ffn_down.weight", hw[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", hw["model.norm.weight"])
    mat("output.weight", hw["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


# ------------------------------------------------------------------ SentencePiece toy vocabulary

SPM_NORMAL, SPM_CONTROL, SPM_USER, SPM_BYTE = 1, 3, 4, 6  # GGUF token types
# A Gemma-shaped toy: control tokens first, user-defined whitespace runs and an HTML tag,
# the 256 byte tokens, then normal pieces with distinct scores (higher merges first).
# Traps: "abc" where "bc" outscores "ab" (score order, not longest match); "<b" + "os>"
# spells the control token <bos> and "<0x4" + "1>" the byte token <0x41> (llama.cpp could
# merge into them; intdet keeps such text plain); "ü" is no piece (byte fallback).
SPM_TOY_PIECES = (
    [("<pad>", SPM_CONTROL, -1000.0), ("<eos>", SPM_CONTROL, -1000.0), ("<bos>", SPM_CONTROL, -1000.0),
     ("<unk>", SPM_CONTROL, -1000.0), ("<start_of_turn>", SPM_CONTROL, -1000.0), ("<end_of_turn>", SPM_CONTROL, -1000.0),
     ("\n", SPM_USER, -1000.0), ("\n\n", SPM_USER, -1000.0), ("  ", SPM_USER, -1000.0), ("   ", SPM_USER, -1000.0),
     ("\t", SPM_USER, -1000.0), ("<b>", SPM_USER, -1000.0)]
    + [(f"<0x{b:02X}>", SPM_BYTE, 0.0) for b in range(256)]
    + [(text, SPM_NORMAL, -float(rank)) for rank, text in enumerate([
        "\u2581", "a", "b", "c", "d", "e", "h", "l", "o", "r", "w", "s", "<", ">", "x", "0", "1", "4", "é", "日",
        "bc", "he", "ll", "hell", "hello", "\u2581hello", "\u2581w", "or", "\u2581wor", "ld", "\u2581world",
        "ab", "<b", "os", "os>", "0x", "<0x", "<0x4", "1>", "\u2581a", "\u2581ab", "\u2581x", "xx", "xxx", "日日"])]
)

def write_gpt2_tokenizer(w, V: int) -> None:
    """The byte-level BPE test tokenizer into GGUF writer ``w``, padded to
    vocab_size ``V`` like the converter's get_vocab_base."""
    import gguf

    toks = vocab_list()
    types = [gguf.TokenType.CONTROL if t in SPECIAL_TOKENS else gguf.TokenType.NORMAL for t in toks]
    toks += [f"[PAD{i}]" for i in range(len(toks), V)]
    types += [gguf.TokenType.UNUSED] * (V - len(types))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in MERGES])
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(False)


def write_spm_tokenizer(w, V: int, add_space_prefix: bool = False) -> None:
    """The SentencePiece toy SPM_TOY_PIECES (Gemma 3's kind: scores, byte
    fallback, BOS added) into GGUF writer ``w``, padded with UNUSED pieces."""
    import gguf

    n = len(SPM_TOY_PIECES)
    assert n <= V
    w.add_tokenizer_model("llama")
    w.add_token_list([p[0] for p in SPM_TOY_PIECES] + [f"[PAD{i}]" for i in range(n, V)])
    w.add_token_types([p[1] for p in SPM_TOY_PIECES] + [gguf.TokenType.UNUSED] * (V - n))
    w.add_token_scores([p[2] for p in SPM_TOY_PIECES] + [-1e9] * (V - n))
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(add_space_prefix)


# ------------------------------------------------------------------ Gemma 3 GGUF

# Row lengths multiples of 32 (Q5_0 / Q8_0 blocks); the rest as GEMMA3_TINY.
GEMMA3_GGUF_SHAPE = dict(hidden_size=96, intermediate_size=160, head_dim=32)


def write_gemma3_gguf(path: str, qtype: str = "Q5_0", seed: int = 0, spm: bool = False, add_space_prefix: bool = False,
                      **overrides) -> tuple[str, dict]:
    """A gemma3 GGUF as llama.cpp's convert_hf_to_gguf.py Gemma3Model would
    make from write_hf_model(d, "gemma3", seed, **GEMMA3_GGUF_SHAPE): norm
    weights stored as 1 + w, Q/K rows not permuted, no output.weight (tied),
    no GGUF key for the layer pattern, local RoPE base or attention scalar;
    2-D tensors in `qtype` (F32, Q8_0 or Q5_0), 1-D F32, the gpt2 test
    tokenizer (``spm``: the SentencePiece toy SPM_TOY_PIECES, as Gemma 3's
    real GGUF has, padded with UNUSED pieces; ``add_space_prefix`` its
    GGUF flag). The HF config must use llama.cpp's implied values
    (every 6th layer global, local base 10000, scalar = head_dim).
    Returns (path, the HF config dict of the same weights)."""
    import gguf

    cfg = hf_config("gemma3", **{**GEMMA3_GGUF_SHAPE, "query_pre_attn_scalar": GEMMA3_GGUF_SHAPE["head_dim"],
                                 **overrides})
    L = cfg["num_hidden_layers"]
    cfg["layer_types"] = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(L)]
    hw = hf_weights(cfg, seed)
    H, nh, nkv, D, V = (cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"))
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_name("intdet-tiny-gemma3")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_sliding_window(cfg["sliding_window"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    if spm:
        write_spm_tokenizer(w, V, add_space_prefix)
    else:
        write_gpt2_tokenizer(w, V)

    def mat(name, arr):
        data, raw = quantize_matrix(arr, qtype) if qtype != "F32" else (arr, None)
        w.add_tensor(name, data, raw_dtype=raw)

    def norm(name, arr):  # llama.cpp's norm_shift: Gemma3RMSNorm's (1 + w)
        w.add_tensor(name, (arr + np.float32(1.0)).astype(np.float32))

    mat("token_embd.weight", hw["model.embed_tokens.weight"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    mats = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
            "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
            "mlp.down_proj": "ffn_down"}
    for i in range(L):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        for hn, gn in names.items():
            norm(b + gn + ".weight", hw[p + hn + ".weight"])
        for hn, gn in mats.items():
            mat(b + gn + ".weight", hw[p + hn + ".weight"])
    norm("output_norm.weight", hw["model.norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path), cfg
