"""Print the golden values pinned in tests/test_engine.py (conversion sha256,
chain hash and tokens of the tiny Qwen3 model) and tests/test_int4.py (the
same for its int4 conversion). Run it after an intentional
format change, bump format_version, and paste the printed lines."""

import hashlib
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import models  # noqa: E402

from intdet.convert import convert  # noqa: E402
from intdet.generate import generate  # noqa: E402
from intdet.model import Engine, load_model  # noqa: E402

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12, 64, 128, 3, 77]  # as in test_engine.py

with tempfile.TemporaryDirectory() as d:
    src = models.write_hf_model(os.path.join(d, "src"), "qwen3")
    out = convert(src, os.path.join(d, "out"), progress=False)
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    g = generate(Engine(load_model(out), "cpu"), PROMPT, 16)
    print(f'GOLDEN_MODEL_SHA256 = "{sha}"')
    print(f'GOLDEN_HASH = "{g.hash}"')
    print(f"GOLDEN_TOKENS = {g.tokens}")
    # tests/test_int4.py: the q32-shaped tiny Qwen3 (rows a multiple of 32), int4 weights.
    src4 = models.write_hf_model(os.path.join(d, "src4"), "qwen3", **models.INT4_SHAPE)
    out4 = convert(src4, os.path.join(d, "out4"), progress=False, weights="int4")
    with open(os.path.join(out4, "model.safetensors"), "rb") as f:
        sha4 = hashlib.sha256(f.read()).hexdigest()
    g4 = generate(Engine(load_model(out4), "cpu"), PROMPT, 16)
    print(f'GOLDEN_INT4_MODEL_SHA256 = "{sha4}"')
    print(f'GOLDEN_INT4_HASH = "{g4.hash}"')
    print(f"GOLDEN_INT4_TOKENS = {g4.tokens}")
