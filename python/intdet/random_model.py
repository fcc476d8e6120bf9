"""Deterministic random Hugging Face checkpoints: ``intdet random-model``
and the tiny test models (tests/models.py builds its GGUF files on these).

Every weight comes from a counter-based SplitMix64 stream keyed by (seed,
tensor name), turned into float32 with integer ops plus plain IEEE float64
+,-,*,/ and one final cast, so the files are byte-identical on every machine
and numpy version (numpy.random / torch seeds are never used for weights).
The tokenizer is a 302-token byte-level BPE (3 specials, 256 bytes, 43
merges) with a ChatML template: enough to encode any text.

Shapes (``write_random_model``):
  tiny-llama, tiny-qwen3, tiny-gemma3 (``TINY``; Gemma 3 adds
      ``GEMMA3_TINY``: local/global/local layers, window 5): hidden 72 (not a multiple of 16),
      intermediate 136, 3 layers, 3 heads, 1 kv head (GQA), head_dim 48,
      vocab 320, float32.
  qwen3-0.6b (``QWEN3_0_6B``): Qwen3-0.6B's exact shape (hidden 1024,
      intermediate 3072, 28 layers, 16 heads, 8 kv heads, head_dim 128, vocab
      151936, tied embeddings, q/k norm) in bf16 like the real checkpoint
      (~1.2 GB); vocab rows past the tokenizer are never produced by it.
  qwen3-1.7b, qwen3-4b, llama3-8b (``LARGE_SHAPES``): the published
      models' sizes in bf16 (3.4, 8.0 and 16.1 GB), in shards with
      model.safetensors.index.json as transformers writes them; for the
      scale benchmarks (scripts/bench_scale.py). Written streamed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile

import numpy as np

from .errors import IntdetError

# ------------------------------------------------------------------ PRNG

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def _mix64_int(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def splitmix64(seed: int, n: int) -> list:
    """Reference SplitMix64 (Vigna) with Python ints: first n outputs."""
    out, state = [], seed & MASK64
    for _ in range(n):
        state = (state + GAMMA) & MASK64
        out.append(_mix64_int(state))
    return out


def splitmix64_np(seed: int, start: int, n: int) -> np.ndarray:
    """Outputs start..start+n-1 of the same stream, vectorized. SplitMix64's
    state after i+1 steps is seed + (i+1)*GAMMA, so any slice is computable
    directly; numpy uint64 array arithmetic wraps mod 2**64."""
    U = np.uint64
    with np.errstate(over="ignore"):
        z = np.arange(start + 1, start + n + 1, dtype=U) * U(GAMMA) + U(seed & MASK64)
        z = (z ^ (z >> U(30))) * U(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> U(27))) * U(0x94D049BB133111EB)
    return z ^ (z >> U(31))


def name_seed(seed: int, name: str) -> int:
    """Stream seed of one tensor: FNV-1a-64 of its name mixed with the
    model seed, so a tensor's values never depend on the other tensors."""
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return _mix64_int(h ^ _mix64_int(seed & MASK64))


# Irwin-Hall of four 16-bit uniforms: their sum s is in [0, 262140] with
# mean 131070 and variance 65536**2/3 (to 1 part in 4e9), so
# (s - 131070) * sqrt(3)/65536 is ~N(0,1) on [-3.46, 3.46].
_IH_SCALE = math.sqrt(3.0) / 65536.0  # math.sqrt is correctly rounded IEEE


def prng_normal_like(seed: int, shape, std: float = 1.0, mean: float = 0.0, offset: int = 0) -> np.ndarray:
    """float32 array of `shape`, ~N(mean, std**2), from values offset.. of
    the SplitMix64 stream `seed` (one 64-bit draw per value)."""
    n = int(np.prod(shape, dtype=np.int64))
    z = splitmix64_np(seed, offset, n)
    U = np.uint64
    lanes = U(0x0000FFFF0000FFFF)
    y = (z & lanes) + ((z >> U(16)) & lanes)  # two 32-bit lanes, each a sum of two fields
    s = (y & U(0xFFFFFFFF)) + (y >> U(32))  # sum of the four 16-bit fields
    x = (s.astype(np.float64) - 131070.0) * _IH_SCALE  # exact int -> float64, then IEEE ops
    return (x * float(std) + float(mean)).astype(np.float32).reshape(shape)


def f32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (uint16),
    as torch and ggml do; inputs here are always finite."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)).astype(np.uint16)


# ------------------------------------------------------------- tokenizer

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
BOS_ID, EOS_ID = 0, 2

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Frequent English pairs, in merge-rank order ("Ġ" is the byte-level space,
# "Ċ" the newline); each part exists before it is used.
MERGES = [
    ("Ġ", "t"), ("h", "e"), ("i", "n"), ("e", "r"), ("a", "n"), ("o", "n"), ("r", "e"),
    ("Ġ", "a"), ("Ġt", "he"), ("e", "n"), ("a", "t"), ("o", "r"), ("e", "s"), ("Ġ", "s"),
    ("Ġ", "w"), ("i", "s"), ("i", "t"), ("Ġ", "o"), ("o", "u"), ("e", "d"), ("in", "g"),
    ("Ġ", "c"), ("Ġ", "b"), ("Ġ", "f"), ("Ġ", "i"), ("Ġ", "h"), ("Ġ", "m"), ("Ġ", "p"),
    ("l", "l"), ("Ġ", "an"), ("Ġan", "d"), ("Ġ", "d"), ("a", "r"), ("Ġo", "f"), ("Ġt", "o"),
    ("Ġi", "n"), ("Ġi", "s"), ("Ċ", "Ċ"), ("Ġ", "Ġ"), ("Ġ", "T"), ("l", "e"), ("Ġw", "it"), ("Ġwit", "h"),
]


def byte_symbols() -> list:
    """GPT-2 bytes_to_unicode: the byte-level symbol of byte b is item b."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def vocab_list() -> list:
    """Token strings by id: 3 specials, 256 bytes (id 3+b), then merges."""
    return SPECIAL_TOKENS + byte_symbols() + [a + b for a, b in MERGES]


TOKENIZER_SIZE = len(SPECIAL_TOKENS) + 256 + len(MERGES)  # 302


def make_tokenizer():
    """tokenizers.Tokenizer: byte-level BPE, GPT-2 regex pre-tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(vocab_list())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(MERGES), fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


# ---------------------------------------------------------------- configs

ARCH_CLASS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
              "gemma3": "Gemma3ForCausalLM"}
# Gemma 3's extras on the TINY shape: a local, a global and a local layer, a
# sliding window (5) shorter than the test prompts, and an attention scalar
# (40) that is not head_dim (48), so each Gemma feature changes the logits.
GEMMA3_TINY = dict(layer_types=["sliding_attention", "full_attention", "sliding_attention"], sliding_window=5,
                   query_pre_attn_scalar=40, rope_local_base_freq=10000.0, hidden_activation="gelu_pytorch_tanh",
                   final_logit_softcapping=None, attn_logit_softcapping=None)

TINY = dict(hidden_size=72, intermediate_size=136, num_hidden_layers=3, num_attention_heads=3,
            num_key_value_heads=1, head_dim=48, vocab_size=320, max_position_embeddings=256)

QWEN3_0_6B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
# The published configs' sizes (Qwen/Qwen3-1.7B, Qwen/Qwen3-4B, meta-llama/Llama-3.1-8B), for the scale
# benchmarks (scripts/bench_scale.py): (architecture, config, shard size in bytes as transformers writes them).
LARGE_SHAPES = {
    "qwen3-1.7b": ("qwen3", dict(QWEN3_0_6B, hidden_size=2048, intermediate_size=6144), 2 << 30),
    "qwen3-4b": ("qwen3", dict(QWEN3_0_6B, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                               num_attention_heads=32), 2 << 30),
    "llama3-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                                num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
                                rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                  high_freq_factor=4.0, original_max_position_embeddings=8192)),
                  5 << 30),
}


def hf_config(arch: str, **overrides) -> dict:
    """config.json contents for a tiny model of `arch`; overrides win."""
    if arch not in ARCH_CLASS:
        raise ValueError(f"arch must be one of {sorted(ARCH_CLASS)}, not {arch!r}")
    cfg = dict(architectures=[ARCH_CLASS[arch]], model_type="gemma3_text" if arch == "gemma3" else arch, **TINY,
               rope_theta=1000000.0 if arch in ("qwen3", "gemma3") else 10000.0, rms_norm_eps=1e-6,
               tie_word_embeddings=arch != "llama", hidden_act="silu", torch_dtype="float32",
               bos_token_id=BOS_ID, eos_token_id=EOS_ID, attention_dropout=0.0,
               initializer_range=0.02, use_cache=True)
    if arch == "gemma3":
        del cfg["hidden_act"]
        cfg.update(GEMMA3_TINY, attention_bias=False)
    elif arch == "llama":
        cfg.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    else:
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=TINY["num_hidden_layers"])
    if arch == "qwen3":
        cfg["attention_bias"] = False
    if "dtype" in overrides:  # accept transformers 5's name for the storage dtype
        overrides = dict(overrides)
        overrides["torch_dtype"] = overrides.pop("dtype")
    cfg.update(overrides)
    if cfg["torch_dtype"] not in ("float32", "bfloat16"):
        raise ValueError(f"storage dtype must be float32 or bfloat16, not {cfg['torch_dtype']!r}")
    return cfg


def tensor_specs(cfg: dict) -> list:
    """[(hf_name, shape, std, mean)] for every stored tensor. Matrices use
    std 1/sqrt(fan_in) so each layer's output stays O(1); embeddings (and
    lm_head) 2/sqrt(hidden) so tied or not the logits have std ~2: varied
    but far from one-hot. Norm gammas 1 +- 0.1."""
    arch = "gemma3" if cfg["model_type"] == "gemma3_text" else cfg["model_type"]
    gemma = arch == "gemma3"
    norm_mean = 0.0 if gemma else 1.0  # Gemma3RMSNorm multiplies by (1 + w)
    H, I, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    D = cfg.get("head_dim") or H // nh
    bias = bool(cfg.get("attention_bias"))
    qkv_bias, o_bias = arch == "qwen2" or bias, arch != "qwen2" and bias

    def lin(fan_in):
        return 1.0 / math.sqrt(fan_in)

    emb = 2.0 / math.sqrt(H)
    specs = [("model.embed_tokens.weight", (V, H), emb, 0.0)]
    for i in range(L):
        p = f"model.layers.{i}."
        specs.append((p + "input_layernorm.weight", (H,), 0.1, norm_mean))
        for proj, rows in (("q", nh * D), ("k", nkv * D), ("v", nkv * D)):
            specs.append((p + f"self_attn.{proj}_proj.weight", (rows, H), lin(H), 0.0))
            if qkv_bias:
                specs.append((p + f"self_attn.{proj}_proj.bias", (rows,), 0.1, 0.0))
        specs.append((p + "self_attn.o_proj.weight", (H, nh * D), lin(nh * D), 0.0))
        if o_bias:
            specs.append((p + "self_attn.o_proj.bias", (H,), 0.1, 0.0))
        if arch in ("qwen3", "gemma3"):
            specs.append((p + "self_attn.q_norm.weight", (D,), 0.1, norm_mean))
            specs.append((p + "self_attn.k_norm.weight", (D,), 0.1, norm_mean))
        specs.append((p + "post_attention_layernorm.weight", (H,), 0.1, norm_mean))
        if gemma:
            specs.append((p + "pre_feedforward_layernorm.weight", (H,), 0.1, 0.0))
            specs.append((p + "post_feedforward_layernorm.weight", (H,), 0.1, 0.0))
        specs.append((p + "mlp.gate_proj.weight", (I, H), lin(H), 0.0))
        specs.append((p + "mlp.up_proj.weight", (I, H), lin(H), 0.0))
        specs.append((p + "mlp.down_proj.weight", (H, I), lin(I), 0.0))
    specs.append(("model.norm.weight", (H,), 0.1, norm_mean))
    if not cfg.get("tie_word_embeddings"):
        specs.append(("lm_head.weight", (V, H), emb, 0.0))
    return specs


def tensor_values(seed: int, spec, offset: int = 0, count: int | None = None) -> np.ndarray:
    """Flat float32 values offset..offset+count of one tensor (whole tensor
    by default); chunks concatenate to exactly the whole tensor."""
    name, shape, std, mean = spec
    n = int(np.prod(shape, dtype=np.int64))
    count = n - offset if count is None else count
    return prng_normal_like(name_seed(seed, name), (count,), std, mean, offset)


def hf_weights(cfg: dict, seed: int = 0) -> dict:
    """HF name -> float32 array (before any bf16 rounding)."""
    return {s[0]: tensor_values(seed, s).reshape(s[1]) for s in tensor_specs(cfg)}


# --------------------------------------------------------------- writers

# Values generated per numpy pass: 2^16 keep the ~20 uint64 temporaries of
# prng_normal_like in the L2 cache (3-5x faster per value than 2^22).
_CHUNK = 1 << 16
# Values per job of a parallel write: large enough that the process pool's
# overhead is small, small enough that 16 workers share a 2 GiB shard evenly.
_PIECE = 1 << 24


def _tensor_bytes(seed: int, spec, start: int, count: int, bf16: bool, chunk: int = _CHUNK) -> bytes:
    """The stored bytes of values start..start+count of one tensor."""
    parts = []
    for s in range(start, start + count, chunk):
        v = tensor_values(seed, spec, s, min(chunk, start + count - s))
        parts.append((f32_to_bf16_bits(v) if bf16 else v).tobytes())
    return b"".join(parts)


def _write_piece(path: str, offset: int, seed: int, spec, start: int, count: int, bf16: bool) -> int:
    """One job of a parallel write: values start..start+count of `spec`
    written at byte `offset` of the (pre-sized) file. Returns the count."""
    data = _tensor_bytes(seed, spec, start, count, bf16)
    fd = os.open(path, os.O_WRONLY)
    try:
        view, pos = memoryview(data), offset
        while view:  # pwrite may write less than asked
            n = os.pwrite(fd, view, pos)
            view, pos = view[n:], pos + n
    finally:
        os.close(fd)
    return count


def _safetensors_header(specs: list, bf16: bool) -> tuple[bytes, dict]:
    """(the file's first bytes: length + JSON header, name -> data_offsets)."""
    esz = 2 if bf16 else 4
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _, _ in specs:
        nbytes = int(np.prod(shape, dtype=np.int64)) * esz
        header[name] = {"dtype": "BF16" if bf16 else "F32", "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)  # the format pads the header to 8 bytes with spaces
    return len(hb).to_bytes(8, "little") + hb, {k: v["data_offsets"] for k, v in header.items() if k != "__metadata__"}


def write_safetensors(path: str, specs: list, seed: int, bf16: bool, chunk: int = _CHUNK, log=None,
                      pool=None) -> None:
    """Stream tensors into a .safetensors file chunk by chunk, so a 600M-value
    model never sits in memory as float32. (safetensors.numpy.save_file
    cannot store bfloat16 and needs every array in memory at once.)
    pool: a concurrent.futures process pool that writes pieces of the
    tensors at their offsets side by side (the same bytes)."""
    if pool is not None:
        _wait_pieces(_submit_safetensors(path, specs, seed, bf16, pool), specs, log)
        return
    head, _ = _safetensors_header(specs, bf16)
    with open(path, "wb") as f:
        f.write(head)
        for k, spec in enumerate(specs):
            n = int(np.prod(spec[1], dtype=np.int64))
            for start in range(0, n, chunk):
                f.write(_tensor_bytes(seed, spec, start, min(chunk, n - start), bf16, chunk))
            if log:
                log(f"[{k + 1}/{len(specs)}] {spec[0]} {tuple(spec[1])}")


def _submit_safetensors(path: str, specs: list, seed: int, bf16: bool, pool) -> list:
    """Write the header, size the file, and queue its pieces on pool;
    returns one list of futures per tensor."""
    head, offsets = _safetensors_header(specs, bf16)
    esz = 2 if bf16 else 4
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + max((o[1] for o in offsets.values()), default=0))
    pieces = []
    for spec in specs:
        n = int(np.prod(spec[1], dtype=np.int64))
        t0 = len(head) + offsets[spec[0]][0]
        pieces.append([pool.submit(_write_piece, path, t0 + start * esz, seed, spec, start, min(_PIECE, n - start),
                                   bf16) for start in range(0, n, _PIECE)])
    return pieces


def _wait_pieces(pieces: list, specs: list, log) -> None:
    """Wait for every piece (raising the first error); a tensor's log line
    once all its pieces are written, in order."""
    for k, futs in enumerate(pieces):
        for fut in futs:
            fut.result()
        if log:
            log(f"[{k + 1}/{len(specs)}] {specs[k][0]} {tuple(specs[k][1])}")


def write_tokenizer_files(out_dir: str, cfg: dict) -> None:
    make_tokenizer().save(os.path.join(out_dir, "tokenizer.json"))
    tc = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False, "add_eos_token": False,
        "bos_token": SPECIAL_TOKENS[BOS_ID], "eos_token": SPECIAL_TOKENS[EOS_ID], "pad_token": SPECIAL_TOKENS[0],
        "unk_token": None, "model_max_length": cfg["max_position_embeddings"],
        "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE,
    }
    _dump_json(os.path.join(out_dir, "tokenizer_config.json"), tc)
    gc = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False}
    _dump_json(os.path.join(out_dir, "generation_config.json"), gc)


def _dump_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def shard_specs(specs: list, esz: int, shard_bytes: int) -> list:
    """Split the tensor list into consecutive shards of at most shard_bytes
    (a larger tensor gets a shard of its own), as save_pretrained does."""
    shards, cur, size = [], [], 0
    for spec in specs:
        n = int(np.prod(spec[1], dtype=np.int64)) * esz
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(spec)
        size += n
    return shards + ([cur] if cur else [])


def write_hf_model(out_dir: str, arch: str, seed: int = 0, log=None, shard_bytes: int | None = None,
                   pool=None, **overrides) -> str:
    """Write a Hugging Face checkpoint dir (config.json, model.safetensors,
    tokenizer.json, tokenizer_config.json, generation_config.json).
    overrides change any config key; dtype/torch_dtype="bfloat16" stores
    BF16 (round-to-nearest-even of the same float32 values). shard_bytes:
    write model-0000k-of-0000n.safetensors shards of at most that size and
    model.safetensors.index.json, as transformers does for large models.
    pool: a process pool that writes the tensors' pieces side by side (every
    shard's at once; the same bytes)."""
    cfg = hf_config(arch, **overrides)
    os.makedirs(out_dir, exist_ok=True)
    _dump_json(os.path.join(out_dir, "config.json"), cfg)
    bf16 = cfg["torch_dtype"] == "bfloat16"
    specs = tensor_specs(cfg)
    if shard_bytes is None:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), specs, seed, bf16=bf16, log=log, pool=pool)
    else:
        shards = shard_specs(specs, 2 if bf16 else 4, shard_bytes)
        weight_map, total, queued = {}, 0, []
        for k, part in enumerate(shards):
            fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            if pool is None:
                write_safetensors(os.path.join(out_dir, fname), part, seed, bf16=bf16, log=log)
            else:  # queue every shard before waiting, so no worker idles at a shard's end
                queued.append((_submit_safetensors(os.path.join(out_dir, fname), part, seed, bf16, pool), part))
            for spec in part:
                weight_map[spec[0]] = fname
                total += int(np.prod(spec[1], dtype=np.int64)) * (2 if bf16 else 4)
        for pieces, part in queued:
            _wait_pieces(pieces, part, log)
        _dump_json(os.path.join(out_dir, "model.safetensors.index.json"),
                   {"metadata": {"total_size": total}, "weight_map": weight_map})
    write_tokenizer_files(out_dir, cfg)
    return str(out_dir)


# ------------------------------------------------------------ entry point

SHAPES = ("qwen3-0.6b", "tiny-llama", "tiny-qwen3", "tiny-gemma3", *LARGE_SHAPES)


def write_random_model(out_dir: str, shape: str = "qwen3-0.6b", seed: int = 0, log=None, jobs: int = 1) -> str:
    """Write the checkpoint of ``shape`` (one of ``SHAPES``) and ``seed`` to
    ``out_dir``, through a temporary sibling directory renamed into place,
    so an interrupted run leaves no half checkpoint at out_dir. ``log(msg)``
    gets one line per tensor. ``jobs`` > 1: that many worker processes
    generate and write the tensors' pieces side by side (the same bytes;
    the 8B shape on 16 cores in seconds instead of minutes). Returns out_dir.

    Raises IntdetError for an unknown shape, jobs < 1, an out_dir that exists
    and is not an empty directory, or OUT cannot be written (naming OUT)."""
    if shape not in SHAPES:
        raise IntdetError(f"shape {shape!r}: choose one of {', '.join(SHAPES)}", field="shape")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise IntdetError(f"jobs: {jobs!r} must be an integer >= 1", field="jobs")
    out_dir = os.path.abspath(out_dir)
    if os.path.lexists(out_dir) and not (os.path.isdir(out_dir) and not os.path.islink(out_dir)
                                         and not os.listdir(out_dir)):
        raise IntdetError(f"{out_dir}: exists and is not an empty directory")
    parent = os.path.dirname(out_dir)
    try:
        if jobs == 1:
            _write_into(out_dir, parent, shape, seed, log, None)
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn: the workers need only numpy and this module, and fork is unsafe under threads
            with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
                try:
                    _write_into(out_dir, parent, shape, seed, log, pool)
                except BaseException:
                    pool.shutdown(wait=True, cancel_futures=True)  # drop the queued pieces at once
                    raise
    except OSError as e:  # named by OUT, not by the temporary directory
        raise IntdetError(f"{out_dir}: cannot write the checkpoint ({e.strerror or e})") from None
    return out_dir


def _write_into(out_dir: str, parent: str, shape: str, seed: int, log, pool) -> None:
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.partial-", dir=parent)
    try:
        if shape in LARGE_SHAPES:
            arch, cfg, shard = LARGE_SHAPES[shape]
            extra = dict(max_window_layers=cfg["num_hidden_layers"]) if arch == "qwen3" else {}
            write_hf_model(tmp, arch, seed=seed, log=log, torch_dtype="bfloat16", shard_bytes=shard, pool=pool,
                           **extra, **cfg)
        elif shape == "qwen3-0.6b":
            # max_window_layers follows the real config (= layer count; unused without sliding window)
            write_hf_model(tmp, "qwen3", seed=seed, log=log, torch_dtype="bfloat16", pool=pool,
                           max_window_layers=QWEN3_0_6B["num_hidden_layers"], **QWEN3_0_6B)
        else:
            write_hf_model(tmp, shape.split("-", 1)[1], seed=seed, log=log, pool=pool)
        _readable_by_all(tmp)
        os.replace(tmp, out_dir)  # rename(2) onto an absent or empty directory
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _readable_by_all(d: str) -> None:
    """mkdtemp makes the directory 0700; give it the mode of any new directory."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(d, 0o777 & ~umask)
