"""Every supported GGUF tensor type converts, runs bit-exact against the spec
and stays close to the float model of the same dequantized weights."""

import numpy as np
import pytest

import models
from intdet.convert import convert
from intdet.convert.sources import read_source
from intdet.floatref import FloatModel
from intdet.model import Engine, load_model

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12]


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"])
def test_gguf_type(qtype, tmp_path):
    src = models.write_gguf_model(str(tmp_path / f"m-{qtype}.gguf"), qtype)
    out = convert(src, str(tmp_path / "out"), progress=False)
    lm = load_model(out)
    cpu = Engine(lm, "cpu").new_state(32).forward(PROMPT, all_logits=True)
    ref = Engine(lm, "ref").new_state(32).forward(PROMPT, all_logits=True)
    assert np.array_equal(cpu, ref)
    lf = FloatModel(read_source(src), np.float64, max_len=32).forward(np.array(PROMPT), 0)
    li = cpu / 65536.0
    rel = np.sqrt(np.mean((li - lf) ** 2) / np.mean(lf**2))
    assert rel < 0.04, rel
