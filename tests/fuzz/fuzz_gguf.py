"""Fuzz GGUF reading: check_gguf_structure(path), then read_gguf(path) (the
gguf package's reader, the tokenizer rebuild, dequantization and every
hyper-parameter check), on mutated bytes of a small valid llama GGUF.
IntdetError is the only accepted failure. See harness.py for the options;
scripts/fuzz.sh runs it for longer, tests/convert/test_fuzz_smoke.py for ~20 s."""

from __future__ import annotations

import math
import os
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import seeds  # noqa: E402

import gguf_bytes as gb  # noqa: E402  (tests/gguf_bytes.py)
from intdet.convert import gguf_check, sources  # noqa: E402


def target(path):
    gguf_check.check_gguf_structure(path)
    sources.read_gguf(path)


KEYS = ["general.architecture", "general.alignment", "llama.context_length", "llama.embedding_length",
        "llama.block_count", "llama.feed_forward_length", "llama.attention.head_count", "llama.attention.head_count_kv",
        "llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon", "llama.attention.key_length",
        "llama.rope.dimension_count", "llama.rope.scaling.type", "llama.vocab_size", "tokenizer.ggml.model",
        "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
        "tokenizer.ggml.scores", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.add_bos_token", "tokenizer.chat_template", "tokenizer.ggml.padding_token_id"]
STRINGS = ["", "llama", "gpt2", "none", "linear", "qwen2", "llama-bpe", "default", "Ġ t", "a b c", "<s>", "\u00e9",
           "x" * 300, "{{ raise_exception('x') }}", "{% for %}"]
FLOATS = [math.nan, math.inf, -math.inf, -1.0, 0.0, 1e-30, 1e30, 0.5, 1.0, 10000.0]
TENSOR_TYPES = [0, 1, 2, 3, 8, 12, 13, 14, 30, 6, 10, 24, 26, 28, 33, 200]


def rand_value(rng):
    k = rng.randrange(10)
    if k == 0:
        return gb.u32(harness.interesting(rng, 1000) & 0xFFFFFFFF)
    if k == 1:
        return 5, struct.pack("<i", rng.choice([-1, -(2**31), 0, 1, 32, 264]))
    if k == 2:
        return gb.u64(harness.interesting(rng, 1000) & (2**64 - 1))
    if k == 3:
        return 6, struct.pack("<f", rng.choice(FLOATS))
    if k == 4:
        return 7, bytes([rng.choice([0, 1, 2, 255])])
    if k == 5:
        return gb.string(rng.choice(STRINGS))
    if k == 6:
        n = rng.choice([0, 1, 3, 264, 265])
        return gb.T_ARRAY, struct.pack("<IQ", 5, n) + struct.pack(f"<{n}i", *[rng.choice([0, 1, 3, 4, -1, 6]) for _ in range(n)])
    if k == 7:
        n = rng.choice([0, 1, 2, 264])
        body = b"".join(gb.string(rng.choice(STRINGS) + str(i))[1] for i in range(n))
        return gb.T_ARRAY, struct.pack("<IQ", gb.T_STRING, n) + body
    if k == 8:
        return 12, struct.pack("<d", rng.choice(FLOATS))
    n = rng.choice([0, 1, 264])
    return gb.T_ARRAY, struct.pack("<IQ", 6, n) + struct.pack(f"<{n}f", *[rng.choice(FLOATS) for _ in range(n)])


def structure(data: bytes, rng):
    """Change one header field of a parsed GGUF (gb.parse trusts its input:
    the harness falls back to a byte mutation when it fails)."""
    g = gb.parse(data)
    op = rng.randrange(12)
    t = rng.choice(g.tensors) if g.tensors else None
    if op == 0 and t:
        if t.dims and rng.random() < 0.7:
            t.dims[rng.randrange(len(t.dims))] = rng.choice([1, 2, 31, 32, 33, 64, 264, 265, 2**31, 2**32, 2**63])
        elif rng.random() < 0.5:
            t.dims.append(rng.choice([1, 2]))
        else:
            t.dims = t.dims[:-1]
    elif op == 1 and t:
        t.ttype = rng.choice(TENSOR_TYPES)
    elif op == 2 and t:
        other = rng.choice(g.tensors)
        t.offset = rng.choice([other.offset, other.offset + 32, 0, len(g.data), len(g.data) - 32, 2**64 - 32])
    elif op == 3 and g.kvs:
        rng.choice(g.kvs).vtype = rng.randrange(14)
    elif op in (4, 5, 6):
        gb.set_kv(g, rng.choice(KEYS), rand_value(rng))
    elif op == 7 and g.kvs:
        del g.kvs[rng.randrange(len(g.kvs))]
    elif op == 8 and t:
        if rng.random() < 0.5:
            g.tensors.remove(t)
        else:
            g.tensors.insert(rng.randrange(len(g.tensors) + 1), gb.TensorInfo(t.name, list(t.dims), t.ttype, t.offset))
    elif op == 9 and t:
        t.name = rng.choice(g.tensors).name if rng.random() < 0.5 else rng.choice(
            [b"output.weight", b"blk.1.attn_q.weight", b"blk.0.attn_q.bias", b"", b"token_embd", b"\xff"])
    elif op == 10:
        return gb.build(g, tensor_count=rng.choice([None, len(g.tensors) + 1, 0]),
                        kv_count=rng.choice([None, len(g.kvs) - 1, len(g.kvs) + 1]))
    else:
        cut = rng.choice(g.boundaries)
        return gb.build(g)[:cut]
    return gb.build(g)


def main():
    tmp = tempfile.mkdtemp()
    try:
        path = seeds.write_gguf_seed(os.path.join(tmp, "seed.gguf"))
        with open(path, "rb") as f:
            seed = f.read()
        header_len = gguf_check.check_gguf_structure(path)["data_start"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    import gguf.gguf_reader  # noqa: F401  (loaded before instrumenting)
    import intdet.tokenizer  # noqa: F401

    tokenizer = [f"intdet.tokenizer.{m}" for m in ("gguf", "meta", "hf", "files", "text", "chat", "stream")]
    harness.instrument(["intdet.convert.gguf_check", "intdet.convert.sources", *tokenizer, "gguf.gguf_reader",
                        "gguf.quants"])
    return harness.Fuzzer("gguf", target, seed, header_len, structure).run()


if __name__ == "__main__":
    sys.exit(main())
