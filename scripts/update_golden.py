"""Print the golden values pinned in tests/engine/test_engine.py (conversion sha256,
chain hash and tokens of the tiny Qwen3 model) and tests/engine/test_int4.py (the
same for its int4 conversion). Run it after an intentional
format change, bump format_version, and paste the printed lines."""

import hashlib
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import models  # noqa: E402

import intdet  # noqa: E402
from intdet.convert import convert  # noqa: E402

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12, 64, 128, 3, 77]  # as in test_engine.py



def golden(d: str, prefix: str, weights: str, **shape) -> None:
    """Convert a tiny Qwen3 (seed 0) and print its pinned lines."""
    src = models.write_hf_model(os.path.join(d, "src-" + weights), "qwen3", **shape)
    out = convert(src, os.path.join(d, "out-" + weights), progress=False, weights=weights)
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    g = intdet.LLM(out, threads=1).generate(PROMPT, intdet.SamplingParams(max_tokens=16))  # greedy, as generate
    print(f'{prefix}MODEL_SHA256 = "{sha}"')
    print(f'{prefix}HASH = "{g.hash}"')
    print(f"{prefix}TOKENS = {g.tokens}")


with tempfile.TemporaryDirectory() as d:
    golden(d, "GOLDEN_", "int8")  # tests/engine/test_engine.py
    # tests/engine/test_int4.py: the q32-shaped tiny Qwen3 (rows a multiple of 32), int4 weights.
    golden(d, "GOLDEN_INT4_", "int4", **models.INT4_SHAPE)
