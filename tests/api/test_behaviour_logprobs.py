"""The behaviour log-probability (sampling.py ``Sampler.behaviour_logprob_q``,
logprobs.py ``ratio_logprob_q``): the exact Q24 log-probability of each
sampled token under the distribution the sampler drew it from, beside the
model's raw log-probability; and ``LLM.score`` of generated tokens giving
the same raw numbers."""

import math

import numpy as np
import pytest

import intdet
from intdet.convert import convert
from intdet.logprobs import ERROR_BOUND, LOGPROB_FRAC_BITS, ratio_logprob_q, to_float
from intdet.sampling import Sampler


@pytest.fixture(scope="module")
def llm(tmp_path_factory, tiny_llama_hf):
    d = convert(tiny_llama_hf, str(tmp_path_factory.mktemp("blp") / "m"), progress=False)
    return intdet.load(d, max_batch=4, step_tokens=16)


def test_ratio_logprob_against_float():
    rng = np.random.default_rng(3)
    assert ratio_logprob_q(5, 5) == 0 and ratio_logprob_q(1 << 30, 1 << 30) == 0
    assert ratio_logprob_q(1, 2) == -round(math.log(2) * 2**LOGPROB_FRAC_BITS)
    for _ in range(300):
        total = int(rng.integers(1, 2**62))
        w = int(rng.integers(1, total + 1))
        assert abs(to_float(ratio_logprob_q(w, total)) - math.log(w / total)) <= 2**-24
    for bad in ((0, 3), (4, 3), (-1, 5)):
        with pytest.raises(ValueError):
            ratio_logprob_q(*bad)


def _float_logprobs(logits, temperature, top_k=0):
    """log-softmax of logits / T over the top_k largest (all when 0), in float64."""
    x = logits.astype(np.float64) / 65536 / temperature
    order = np.lexsort((np.arange(len(x)), -logits.astype(np.int64)))
    kept = order[:top_k] if top_k else order
    lse = x[kept].max() + math.log(np.exp(x[kept] - x[kept].max()).sum())
    return {int(t): x[t] - lse for t in kept}


@pytest.mark.parametrize("temperature,top_k", [("1", 0), ("0.7", 0), ("1.3", 40), ("2", 5)])
def test_behaviour_is_the_sampled_distribution(temperature, top_k):
    rng = np.random.default_rng(len(temperature) + top_k)
    for _ in range(4):
        lg = (rng.standard_normal(300) * 3 * 65536).astype(np.int32)
        s = Sampler(temperature=temperature, top_k=top_k, seed=9)
        want = _float_logprobs(lg, float(temperature), top_k)
        # the sampler rounds each gap to Q16 log2 units, then again after dividing by T: both
        # roundings (half a unit each) shift the token's weight and the total's
        tol = 2 * 2**-17 * (1 + 1 / float(temperature)) * math.log(2) + 2**-24
        mass = 0.0
        for t in range(len(lg)):
            q = s.behaviour_logprob_q(lg, t)
            if t not in want:
                assert q is None  # outside top-k: the sampler cannot draw it
                continue
            if q is None:  # a weight below Q30's last unit: probability < 2^-30
                assert want[t] < math.log(2**-29)
                continue
            mass += math.exp(to_float(q))
            if want[t] > math.log(1e-3):  # the Q30 weights' rounding is relative to 2^-30
                assert abs(to_float(q) - want[t]) < tol, (t, to_float(q), want[t])
        assert abs(mass - 1) < 1e-6


def test_pick_logprob_equals_pick_and_greedy_is_zero():
    rng = np.random.default_rng(1)
    lg = (rng.standard_normal(500) * 2 * 65536).astype(np.int32)
    for kw in ({"temperature": "0.8", "top_p": "0.9"}, {"temperature": "1.5", "min_p": "0.05", "top_k": 30},
               {"temperature": "1", "repeat_penalty": "1.3", "repeat_last_n": -1}):
        s = Sampler(seed=4, **kw)
        hist = [int(t) for t in np.argsort(lg)[-20:]]
        for pos in range(40):
            tok, q = s.pick_logprob(lg, pos, hist)
            assert tok == s.pick(lg, pos, hist)
            assert q == s.behaviour_logprob_q(lg, tok, hist) and q <= 0
    g = Sampler()
    best = int(np.argmax(lg))
    assert g.pick_logprob(lg, 3) == (best, 0)
    assert g.behaviour_logprob_q(lg, best) == 0 and g.behaviour_logprob_q(lg, best + 1) is None
    allowed = np.zeros(len(lg), bool)
    allowed[[7, 11]] = True  # a grammar's mask: the draw is over the allowed ids alone
    s = Sampler(temperature="1", seed=2)
    w = {t: 2.0 ** (-(int(lg.max()) - int(lg[t])) / 65536 * math.log2(math.e)) for t in (7, 11)}
    for t in (7, 11):
        assert abs(to_float(s.behaviour_logprob_q(lg, t, (), allowed)) - math.log(w[t] / sum(w.values()))) < 3e-5
    assert s.behaviour_logprob_q(lg, 12, (), allowed) is None


def test_api_reports_behaviour_beside_raw(llm):
    prompt = [5, 17, 99, 230]
    plain = llm.generate(prompt, intdet.SamplingParams(max_tokens=10, temperature=1, seed=3, logprobs=2))
    for t in plain.logprobs:
        # temperature 1 without filters: the behaviour policy is the model's own distribution
        assert t.behaviour_logprob_q is not None and abs(t.behaviour_logprob - t.logprob) <= 2 * ERROR_BOUND
        assert t.behaviour_logprob == t.behaviour_logprob_q / 2**24
    hot = llm.generate(prompt, intdet.SamplingParams(max_tokens=10, temperature="0.5", top_k=3, seed=3, logprobs=0))
    assert all(t.behaviour_logprob_q >= t.logprob_q for t in hot.logprobs)  # sharper and truncated: more likely
    assert any(t.behaviour_logprob_q != t.logprob_q for t in hot.logprobs)
    greedy = llm.generate(prompt, intdet.SamplingParams(max_tokens=6, logprobs=0, repeat_penalty="1.2"))
    assert [t.behaviour_logprob_q for t in greedy.logprobs] == [0] * 6
    # the same tokens scored: the same raw numbers
    for c in (plain, hot, greedy):
        s = llm.score(c.prompt_ids, c.tokens)
        assert [t.logprob_q for t in s.logprobs] == [t.logprob_q for t in c.logprobs]
        assert all(t.behaviour_logprob_q is None for t in s.logprobs)
