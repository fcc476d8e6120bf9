"""Integer sampling: greedy ties, seeds, temperature/top-k/top-p semantics."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intdet.errors import IntdetError
from intdet.ref.intmath import LOG2E_Q30, exp2_neg_q30, round_div, round_shift
from intdet.sampling import Sampler, apply_repeat_penalty, draw_u64, splitmix64


def test_splitmix64_reference_value():
    # First output of SplitMix64 from state 0 (Vigna's reference implementation).
    assert splitmix64(0) == 0xE220A8397B1DCDAF


def test_greedy_lowest_id_wins_ties():
    logits = np.array([3, 9, 9, -4, 9], dtype=np.int32)
    assert Sampler().pick(logits, 0) == 1
    assert Sampler(temperature="0.7", top_k=1, seed=5).pick(logits, 3) == 1


def penalized(logits, recent, r):
    """The repetition penalty by its definition, in exact fractions."""
    from fractions import Fraction

    r = Fraction(r)
    out = [int(v) for v in logits]
    for t in set(recent):
        v = Fraction(out[t])
        x = v / r if v > 0 else v * r
        # round half away from zero
        out[t] = int((abs(x) + Fraction(1, 2)) // 1) * (1 if x >= 0 else -1)
    return np.array(out, dtype=np.int64)


def brute_force(s: Sampler, logits, position, history=()):
    """The definition without the zero-weight filter."""
    lg_all = np.asarray(logits, dtype=np.int64)
    if s.penalized:
        lg_all = penalized(lg_all, s.recent(list(history)), s.repeat_penalty)
    if s.greedy:
        return int(np.argmax(lg_all))
    order = np.lexsort((np.arange(len(lg_all)), -lg_all))
    if s.top_k:
        order = order[: s.top_k]
    lg = lg_all[order]
    d = np.minimum(lg[0] - lg, 1 << 26)
    w = exp2_neg_q30(round_div(round_shift(d * LOG2E_Q30, 30) * s.t_den, s.t_num))
    cum = [int(c) for c in np.cumsum(w)]
    if s.p_num != s.p_den:
        n = next(i for i, c in enumerate(cum) if c * s.p_den >= cum[-1] * s.p_num) + 1
        cum = cum[:n]
    if s.m_num:
        from fractions import Fraction

        cum = [c for c, wi in zip(cum, w) if Fraction(int(wi), 2**30) >= Fraction(s.m_num, s.m_den)] or cum[:1]
    target = (draw_u64(s.seed, position) * cum[-1]) >> 64
    return int(order[next(i for i, c in enumerate(cum) if c > target)])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-(2**31) + 1, 2**31 - 1), min_size=1, max_size=60),
    st.sampled_from(["0.1", "0.5", "1", "1.3", "7"]),
    st.integers(0, 70),
    st.sampled_from(["1", "0.9", "0.5", "0.01"]),
    st.integers(0, 2**64 - 1),
    st.integers(0, 10**6),
)
def test_pick_matches_definition(logits, temp, top_k, top_p, seed, pos):
    arr = np.array(logits, dtype=np.int32) >> np.int32(np.random.default_rng(seed % 97).integers(0, 24))
    s = Sampler(temperature=temp, top_k=top_k, top_p=top_p, seed=seed)
    assert s.pick(arr, pos) == brute_force(s, arr, pos)


def test_seed_reproducible_and_distribution():
    # logits 0 and ln(3) in Q16: p = 1/4, 3/4 at temperature 1.
    logits = np.array([0, int(round(np.log(3) * 65536))], dtype=np.int32)
    s = Sampler(temperature="1", seed=123)
    picks = [s.pick(logits, p) for p in range(4000)]
    assert picks == [Sampler(temperature="1", seed=123).pick(logits, p) for p in range(4000)]
    frac = np.mean(picks)
    assert 0.72 < frac < 0.78
    assert picks != [Sampler(temperature="1", seed=124).pick(logits, p) for p in range(4000)]


def test_top_p_and_top_k_restrict():
    logits = np.array([10, 9, 8, 7, 6], dtype=np.int32) * 65536
    s = Sampler(temperature="1", top_k=2, seed=1)
    assert {s.pick(logits, p) for p in range(300)} == {0, 1}
    s = Sampler(temperature="1", top_p="0.000001", seed=1)
    assert {s.pick(logits, p) for p in range(100)} == {0}


@pytest.mark.parametrize("kw", [{"temperature": "abc"}, {"temperature": "-1"}, {"top_p": "1.5"}, {"top_p": "0"},
                                {"top_k": -1}, {"seed": -1}, {"temperature": "0.1234567"}])
def test_bad_options(kw):
    """The error names the field (the API's parameter name), not a CLI option."""
    with pytest.raises(IntdetError) as e:
        Sampler(**kw)
    (name,) = kw
    assert e.value.field == name and str(e.value).startswith(name + ": "), (str(e.value), e.value.field)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-(2**31) + 1, 2**31 - 1), min_size=1, max_size=40),
    st.sampled_from(["0", "0.5", "1", "3"]),
    st.sampled_from(["1", "0.9"]),
    st.sampled_from(["0", "0.05", "0.5", "1"]),
    st.sampled_from(["1", "1.1", "1.5", "0.8", "100"]),
    st.integers(-1, 20),
    st.lists(st.integers(0, 39), max_size=30),
    st.integers(0, 2**64 - 1),
)
def test_pick_with_min_p_and_penalty_matches_definition(logits, temp, top_p, min_p, pen, last_n, hist, seed):
    arr = np.array(logits, dtype=np.int32) >> np.int32(seed % 20)
    hist = [h % len(logits) for h in hist]
    s = Sampler(temperature=temp, top_p=top_p, seed=seed, min_p=min_p, repeat_penalty=pen, repeat_last_n=last_n)
    assert s.pick(arr, 7, hist) == brute_force(s, arr, 7, hist)


def test_repeat_penalty_hand_computed():
    lg = np.array([100, -100, 7, 0, 65536, -3], dtype=np.int32)
    out = apply_repeat_penalty(lg, [0, 1, 2, 3, 4, 5, 0], 3, 2)  # r = 1.5
    # 100/1.5 = 66.67 -> 67; -100*1.5 = -150; 7/1.5 = 4.67 -> 5; 0; 65536/1.5 = 43690.67 -> 43691; -3*1.5 = -4.5 -> -5
    assert out.tolist() == [67, -150, 5, 0, 43691, -5]
    assert apply_repeat_penalty(lg, [2], 1, 1).tolist() == lg.tolist()
    assert apply_repeat_penalty(lg, [2], 2, 1).tolist() == [100, -100, 4, 0, 65536, -3]  # 3.5 -> 4 (half away)
    # llama.cpp: only the last repeat_last_n ids, and greedy is penalized too
    g = Sampler(repeat_penalty="2", repeat_last_n=1)
    two = np.array([10, 9], dtype=np.int32) * 65536
    assert g.pick(two, 0, [0]) == 1 and g.pick(two, 0, [0, 1]) == 0 and Sampler().pick(two, 0, [0]) == 0
    assert Sampler(repeat_penalty="2", repeat_last_n=0).pick(two, 0, [0]) == 0
    assert Sampler(repeat_penalty="2", repeat_last_n=-1).pick(two, 0, [0, 1, 1]) == 0


def test_min_p_hand_computed():
    # weights at T=1 of logits 0, -ln2, -ln4 (Q16): 1, 1/2, 1/4 of the top
    ln2 = int(round(np.log(2) * 65536))
    lg = np.array([0, -ln2, -2 * ln2], dtype=np.int32)
    picks = lambda m: {Sampler(temperature="1", min_p=m, seed=9).pick(lg, p) for p in range(400)}  # noqa: E731
    assert picks("0") == {0, 1, 2}
    assert picks("0.3") == {0, 1}  # 1/4 < 0.3 <= 1/2
    assert picks("0.6") == {0}
    assert picks("1") == {0}  # the top token always stays


@pytest.mark.parametrize("kw", [{"min_p": "1.5"}, {"min_p": "-0.1"}, {"repeat_penalty": "0"},
                                {"repeat_penalty": "101"}, {"repeat_penalty": "x"}, {"repeat_last_n": -2}])
def test_bad_new_options(kw):
    with pytest.raises(IntdetError) as e:
        Sampler(**kw)
    (name,) = kw
    assert e.value.field == name and str(e.value).startswith(name + ": "), (str(e.value), e.value.field)
