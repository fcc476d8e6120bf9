"""Constants of the converted model format (docs/format.md), shared by the
converter and the runtime so that neither imports the other.

FORMAT_VERSION 2 (this one) adds config.json "layers": the per-layer block
description the engines read (csrc/include/intdet/layout.h BlockDesc);
version 1 files are refused with "re-convert the model" (the cache converts
again by itself: its entries are keyed by the version). The tensors, and so
every logit, are those of version 1.
"""

from __future__ import annotations

import json
import os

FORMAT_VERSION = 2  # csrc/include/intdet/loader.h kFormatVersion
WEIGHT_FORMATS = ("int8", "int4")
W4_GROUP = 32  # int4 weights: inputs per group
W4_MAX = 2047  # |gd * u + gm| <= 2047 for every code u in 0..15
# config.json's record of model.safetensors' sha256 at conversion, which
# loading compares (model.py); models converted before it have none.
MODEL_SHA256_KEY = "model_sha256"
SKIP_SHA256_ENV = "INTDET_SKIP_SHA256_CHECK"
# Every file `intdet convert` writes into a model directory.
MODEL_FILES = frozenset({"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})


def is_converted(path: str) -> bool:
    """True when ``path`` is a directory whose config.json says ``"format":
    "intdet"`` (of any version: load_model names a stale one)."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and cfg.get("format") == "intdet"
