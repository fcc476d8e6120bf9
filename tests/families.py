"""Tiny checkpoints of the model families, made by transformers itself.

transformers' own config class and model define the architecture (tensor
names, shapes, config.json); the values come from intdet.random_model's
SplitMix64 normal PRNG keyed by tensor name, so the files are the same on
every machine and torch version. Scales: matrices 1/sqrt(fan_in) (times
GAIN, so the logits are peaked rather than flat), embeddings 2/sqrt(H),
RMSNorm gammas 1 +- 0.1 (0 +- 0.1 where the family stores w of 1 + w),
biases 0.1.

``write_family(family, out_dir)`` writes the checkpoint with
``save_pretrained`` plus the test tokenizer; ``hf_logits(dir, tokens)`` is
transformers' float32 forward of it: the oracle no one here wrote."""

from __future__ import annotations

import json
import math
import os

import numpy as np

from intdet.random_model import BOS_ID, EOS_ID, name_seed, prng_normal_like, write_tokenizer_files

TINY = dict(hidden_size=72, intermediate_size=136, num_hidden_layers=3, num_attention_heads=3,
            num_key_value_heads=1, head_dim=48, vocab_size=320, max_position_embeddings=256,
            bos_token_id=BOS_ID, eos_token_id=EOS_ID, rms_norm_eps=1e-6)
GAIN = 1.0  # matrices 1/sqrt(fan_in): O(1) activations
EMB = 4.0  # embeddings and lm_head 4/sqrt(H): logits of std ~4, peaked rather than flat
# MoE routers 4/sqrt(H): router logits of std ~4, so few rows sit on a near-tie between two random
# experts, where any rounding picks the other (its output then differs wholly, as random experts do)
ROUTER = 4.0

# family -> (transformers model_type, config overrides, GGUF pre-tokenizer name for llama.cpp's converter)
FAMILIES = {
    "llama3": ("llama", dict(rope_theta=500000.0, tie_word_embeddings=True, max_position_embeddings=256,
                             rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=32)),
               "llama-bpe"),
    "llama-linear": ("llama", dict(rope_theta=10000.0, rope_scaling=dict(rope_type="linear", factor=4.0)),
                     "llama-bpe"),
    "mistral": ("mistral", dict(sliding_window=7, rope_theta=1000000.0), "llama-bpe"),
    "qwen2": ("qwen2", dict(rope_theta=1000000.0, tie_word_embeddings=True), "qwen2"),
    "qwen2-yarn": ("qwen2", dict(rope_theta=1000000.0, tie_word_embeddings=True,
                                 rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64)),
                   "qwen2"),
    "qwen3": ("qwen3", dict(rope_theta=1000000.0, tie_word_embeddings=True), "qwen2"),
    "qwen3-yarn": ("qwen3", dict(rope_theta=1000000.0, tie_word_embeddings=False,
                                 rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64,
                                                   attention_factor=1.25)),
                   "qwen2"),
    "granite": ("granite", dict(embedding_multiplier=2.0, attention_multiplier=0.3, residual_multiplier=0.7,
                                logits_scaling=2.0, tie_word_embeddings=True, rope_theta=10000.0,
                                head_dim=24), "llama-bpe"),  # llama.cpp drops head_dim: H / heads
    "phi3": ("phi3", dict(sliding_window=9, pad_token_id=0, rope_theta=10000.0, original_max_position_embeddings=256,
                          head_dim=24),  # llama.cpp assumes H / heads
             "llama-bpe"),
    "olmo2": ("olmo2", dict(rope_theta=500000.0, pad_token_id=0), "llama-bpe"),
    "smollm3": ("smollm3", dict(rope_theta=2000000.0, pad_token_id=0, num_hidden_layers=4, tie_word_embeddings=True),
                "llama-bpe"),  # layer 3 NoPE (no_rope_layer_interval 4)
    "qwen3-moe": ("qwen3_moe", dict(num_local_experts=8, num_experts_per_tok=2, moe_intermediate_size=40,
                                    norm_topk_prob=True, rope_theta=1000000.0, pad_token_id=0), "qwen2"),
    # Soft caps small enough to bind on these logits (std ~4) and scores (O(1)); real Gemma 2: 50 and 30.
    "gemma2": ("gemma2", dict(query_pre_attn_scalar=48, sliding_window=7, rope_theta=10000.0, pad_token_id=0,
                              attn_logit_softcapping=1.5, final_logit_softcapping=12.0),
               "llama-bpe"),  # unused: the SentencePiece vocab has no pre-tokenizer
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2, rope_theta=1000000.0, pad_token_id=0,
                                sliding_window=None), "llama-bpe"),
}
# llama.cpp's Phi-3 converter reads tokenizer.model unless the class is GPT2Tokenizer (Phi-4's BPE)
TOKENIZER_CLASS = {"phi3": "GPT2Tokenizer"}
ONE_PLUS_W = ("gemma2",)  # families whose RMSNorm stores w of (1 + w)
SPM = ("gemma2",)  # llama.cpp's converter reads their vocab from a SentencePiece tokenizer.model


def _std_mean(name: str, shape, family: str, H: int):
    if name.endswith("norm.weight"):
        return 0.1, (0.0 if family in ONE_PLUS_W else 1.0)
    if name.endswith(".bias"):
        return 0.1, 0.0
    if "embed_tokens" in name or name.startswith("lm_head"):
        return EMB / math.sqrt(H), 0.0
    if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):  # MoE router: clear choices
        return ROUTER / math.sqrt(H), 0.0
    return GAIN / math.sqrt(shape[-1]), 0.0


def make_config(family: str, **overrides):
    import transformers

    model_type, extra, _ = FAMILIES[family]
    kw = {**TINY, **extra, **overrides}
    return transformers.AutoConfig.for_model(model_type, **kw)


def write_family(family: str, out_dir: str, seed: int = 0, **overrides) -> str:
    """Write the tiny checkpoint of ``family`` (config.json, model.safetensors,
    tokenizer files) into out_dir; returns out_dir."""
    import torch
    import transformers

    cfg = make_config(family, **overrides)
    torch.manual_seed(0)  # only for the init that the values below replace
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    H = cfg.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            std, mean = _std_mean(name, tuple(p.shape), family, H)
            v = prng_normal_like(name_seed(seed, f"{family}:{name}"), tuple(p.shape), std, mean)
            p.copy_(torch.from_numpy(np.ascontiguousarray(v)))
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    write_tokenizer_files(out_dir, {"max_position_embeddings": cfg.max_position_embeddings,
                                    "bos_token_id": BOS_ID, "eos_token_id": EOS_ID})
    if family in SPM:
        write_spm_model(os.path.join(out_dir, "tokenizer.model"), cfg.vocab_size)
    if family in TOKENIZER_CLASS:
        p = os.path.join(out_dir, "tokenizer_config.json")
        with open(p, encoding="utf-8") as f:
            tc = json.load(f)
        tc["tokenizer_class"] = TOKENIZER_CLASS[family]
        with open(p, "w", encoding="utf-8") as f:
            json.dump(tc, f, indent=2)
    return out_dir


def write_spm_model(path: str, vocab_size: int) -> None:
    """A SentencePiece tokenizer.model of exactly vocab_size pieces (the test
    tokenizer's three specials, <unk>, 256 byte pieces, then letters and digits), built
    as sentencepiece's own ModelProto, for converters that read one."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    from intdet.random_model import SPECIAL_TOKENS

    m = pb.ModelProto()
    T = pb.ModelProto.SentencePiece.Type
    pieces = [(s, T.CONTROL) for s in SPECIAL_TOKENS] + [("<unk>", T.UNKNOWN)]
    pieces += [(f"<0x{b:02X}>", T.BYTE) for b in range(256)]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    normal = ["\u2581", *letters, *("\u2581" + c for c in letters), *"0123456789"]
    pieces += [(p, T.NORMAL) for p in normal[: vocab_size - len(pieces)]]
    assert len(pieces) == vocab_size, len(pieces)
    for i, (piece, typ) in enumerate(pieces):
        sp = m.pieces.add()
        sp.piece, sp.type, sp.score = piece, typ, (-float(i) if typ == T.NORMAL else 0.0)
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.vocab_size = vocab_size
    m.trainer_spec.byte_fallback = True
    ts = m.trainer_spec
    ts.unk_id, ts.bos_id, ts.eos_id, ts.pad_id = len(SPECIAL_TOKENS), BOS_ID, EOS_ID, -1
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = False
    m.normalizer_spec.escape_whitespaces = True
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def hf_logits(hf_dir: str, tokens) -> np.ndarray:
    """transformers' float32 logits [T, V] (float64 array) of one prompt."""
    import torch
    import transformers

    m = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return m(torch.tensor([list(tokens)])).logits[0].double().numpy()
