"""Architectures as data: one module per model family (mlx-lm's habit).

Each module names the checkpoints it reads and maps them onto intdet's one
model (csrc/include/intdet/layout.h):
- ``NAME``; ``HF_CLASSES`` (config.json "architectures"); ``GGUF_ARCH``
  (general.architecture) or None;
- ``hparams_from_hf(cfg, where)`` / ``hparams_from_gguf(key, where)``: the
  sizes, refusing every config value that would change the arithmetic and
  that no engine implements;
- ``hf_tensor_name(name)``: Hugging Face -> GGUF-style canonical name (None:
  not a weight, e.g. rotary inv_freq);
- ``gguf_transform(weights, hp)``: weight fix-ups of GGUF files (Q/K
  un-permute); optional ``hf_transform(weights, hp)`` for Hugging Face ones
  (Gemma's 1 + w norm weights);
- ``blocks(hp)``: the per-layer block description written to config.json
  "layers" (block() below), which the engines read instead of a name.

Adding an architecture: a module here, registered in ARCHITECTURES, plus
any op its blocks need that no engine has yet (docs/architecture.md).
"""

from __future__ import annotations

from . import gemma2, gemma3, granite, llama, mistral, mixtral, olmo2, phi3, qwen2, qwen3, qwen3_moe, smollm3
from . import rope_scaling  # noqa: F401  (intdet.models.rope_scaling: the RoPE scaling every family reads)

ARCHITECTURES = {m.NAME: m for m in (llama, qwen2, qwen3, gemma2, gemma3, mistral, granite, phi3, olmo2, smollm3,
                                     qwen3_moe, mixtral)}


def by_hf_class(cls):
    """The module reading config.json architectures[0] == cls, or None."""
    for m in ARCHITECTURES.values():
        if cls in m.HF_CLASSES:
            return m
    return None


def by_gguf_arch(arch):
    """The module reading GGUF general.architecture == arch, or None."""
    for m in ARCHITECTURES.values():
        if m.GGUF_ARCH is not None and m.GGUF_ARCH == arch:
            return m
    return None


def hf_classes():
    return [c for m in ARCHITECTURES.values() for c in m.HF_CLASSES]


def gguf_archs():
    return [m.GGUF_ARCH for m in ARCHITECTURES.values() if m.GGUF_ARCH]
