"""intdet.rl.RolloutPool: GRPO groups from 1, 2 and 4 Ray actors equal one
process, bit for bit; a weight update reaches every actor once and the
groups after it equal a local LLM updated the same way."""

import numpy as np
import pytest

import intdet
import models
from intdet.api import derive_seed
from intdet.convert import convert

pytest.importorskip("ray")

PROMPTS = ["hello world", [5, 17, 99, 230], "the quick brown fox"]
SP = intdet.SamplingParams(max_tokens=12, temperature=0.9, top_k=50, seed=7, logprobs=2)


def key(c):
    return (c.tokens, c.hash, c.seed, [(t.token, t.logprob_q) for t in c.logprobs], c.model_version)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("rl")
    hf = models.write_hf_model(str(d / "hf"), "llama")
    return hf, convert(hf, str(d / "m"), progress=False)


def test_groups_equal_one_process_for_1_2_4_actors(model):
    import dataclasses

    from intdet.rl import RolloutPool

    _, m = model
    local = intdet.LLM(m, threads=1)
    want = [[key(local.generate(p, dataclasses.replace(SP, seed=derive_seed(7, i)))) for i in range(4)]
            for p in PROMPTS]
    assert len({k[1] for g in want for k in g}) > 4  # the samples of a group differ
    import signal

    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    for workers in (1, 2, 4):
        with RolloutPool(m, workers=workers) as pool:
            got = pool.generate(PROMPTS, SP, n=4)
            assert [[key(c) for c in g] for g in got] == want, workers
        # ray.init's signal handlers do not outlive the pool (later code, tests included, sees its own)
        assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before


def test_update_weights_reaches_every_actor(model):
    from safetensors.numpy import load_file

    from intdet.rl import RolloutPool

    hf, m = model
    base = load_file(f"{hf}/model.safetensors")
    rng = np.random.default_rng(3)
    new = {k: v + rng.normal(0, 0.02, v.shape).astype(np.float32) for k, v in base.items()}
    local = intdet.LLM(m, threads=1)
    v_local = local.update_weights(new)
    with RolloutPool(m, workers=2) as pool:
        before = pool.model_version
        assert pool.update_weights(new) == v_local != before
        got = pool.generate(PROMPTS[:2], SP, n=2)
        assert {c.model_version for g in got for c in g} == {v_local}
        assert [[c.hash for c in g] for g in got] == [[c.hash for c in local_group]
                                                     for local_group in ([local.generate(p, intdet.SamplingParams(
                                                         max_tokens=12, temperature=0.9, top_k=50,
                                                         seed=derive_seed(7, i), logprobs=2)) for i in range(2)]
                                                         for p in PROMPTS[:2])]
        bad = dict(new, **{"model.norm.weight": np.full(3, 1.0, np.float32)})
        with pytest.raises(intdet.IntdetError, match="has shape"):
            pool.update_weights(bad)
        assert pool.model_version == v_local
        with pytest.raises(intdet.IntdetError, match="n: 0"):
            pool.generate(PROMPTS, SP, n=0)
