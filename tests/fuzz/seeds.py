"""Small valid seed files for the fuzzers (a few tens of KB, so most
mutations land in the header): a 1-layer llama GGUF with Q8_0 matrices and
a byte-level tokenizer without merges, and a safetensors file holding one
tensor of each dtype (plus a 0-d and an empty one)."""

from __future__ import annotations

import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import models  # noqa: E402  (tests/models.py)


def write_gguf_seed(path: str) -> str:
    import gguf

    H, L, V = 32, 1, 264
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(64)
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(H)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(V)
    toks = models.SPECIAL_TOKENS + models.byte_symbols() + ["Ġt"]
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * 257
    toks += [f"[PAD{i}]" for i in range(len(toks), V)]
    types += [gguf.TokenType.UNUSED] * (V - len(types))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(["Ġ t"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_chat_template(models.CHAT_TEMPLATE)

    def mat(name, rows, cols):
        a = models.prng_normal_like(models.name_seed(0, name), (rows, cols), 0.2)
        w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def norm(name):
        w.add_tensor(name, models.prng_normal_like(models.name_seed(0, name), (H,), 0.1, 1.0))

    mat("token_embd.weight", V, H)
    for i in range(L):
        norm(f"blk.{i}.attn_norm.weight")
        for nm in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            mat(f"blk.{i}.{nm}.weight", H, H)
        norm(f"blk.{i}.ffn_norm.weight")
    norm("output_norm.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


ST_SEED_TENSORS = {
    "a.f32": ("F32", np.arange(12, dtype="<f4").reshape(3, 4)),
    "b.bf16": ("BF16", (np.arange(8, dtype="<f4").view("<u4") >> 16).astype("<u2").reshape(2, 4)),
    "c.f16": ("F16", np.linspace(-2, 2, 6, dtype="<f2")),
    "d.i8": ("I8", np.arange(-4, 4, dtype="i1").reshape(2, 2, 2)),
    "e.u8": ("U8", np.arange(5, dtype="u1")),
    "f.bool": ("BOOL", np.array([True, False, True])),
    "g.i64": ("I64", np.array([1, -1], dtype="<i8")),
    "h.scalar": ("F32", np.array(1.5, dtype="<f4")),
    "i.empty": ("F32", np.zeros((0, 3), dtype="<f4")),
}


def write_safetensors_seed(path: str) -> str:
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dt, a) in ST_SEED_TENSORS.items():
        b = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))
    return path
