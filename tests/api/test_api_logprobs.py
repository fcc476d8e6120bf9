"""logprobs.py: the fixed-point log-softmax against float64 (its stated error
bound), its constants, and the properties the API relies on (order = logit
order, ties equal, exact float conversion)."""

import math
from decimal import Decimal, getcontext

import numpy as np
import pytest

from intdet.logprobs import ERROR_BOUND, LN2_Q64, LOGPROB_FRAC_BITS, LogSoftmax, log2_q, to_float


def test_ln2_constant():
    getcontext().prec = 60
    assert LN2_Q64 == int((Decimal(2).ln() * Decimal(2) ** 64).to_integral_value())


@pytest.mark.parametrize("scale", [1 << 8, 1 << 16, 1 << 18, 1 << 21])
def test_within_error_bound_of_float64(scale):
    rng = np.random.default_rng(scale)
    worst = 0.0
    for vocab in (2, 7, 320, 49152):
        lg = np.clip(rng.standard_normal((4, vocab)) * scale, -2**31 + 1, 2**31 - 1).astype(np.int32)
        ls = LogSoftmax(lg)
        for r in range(4):
            x = lg[r].astype(np.float64) / 65536
            lse = x.max() + math.log(np.exp(x - x.max()).sum())
            for t in rng.integers(0, vocab, 8):
                worst = max(worst, abs(to_float(ls.logprob_q(r, int(t))) - (x[t] - lse)))
    assert worst <= ERROR_BOUND


def test_extremes():
    # all equal: log(1/V); one dominant logit: ~0 and a huge negative rest
    for v in (1, 2, 1000, 150000):
        ls = LogSoftmax(np.full(v, -12345, np.int32))
        assert abs(to_float(ls.logprob_q(0, 0)) + math.log(v)) <= ERROR_BOUND
    lg = np.array([2**31 - 1, -2**31 + 1, 0], np.int32)
    ls = LogSoftmax(lg)
    assert ls.logprob_q(0, 0) == 0
    assert ls.logprob_q(0, 1) == -((2**32 - 2) << (LOGPROB_FRAC_BITS - 16))
    with pytest.raises(TypeError):
        LogSoftmax(np.zeros(3, np.int64))


def test_top_order_and_ties():
    lg = np.array([5, 9, 9, 1, 9, -3], np.int32)
    ls = LogSoftmax(lg)
    top = ls.top(0, 4)
    assert [t for t, _ in top] == [1, 2, 4, 0]  # larger logit first, lower id on ties
    assert top[0][1] == top[1][1] == top[2][1] > top[3][1]
    assert ls.top(0, 0) == [] and len(ls.top(0, 99)) == 6
    q = ls.logprob_q(0, 3)
    assert to_float(q) == q / 2**24 and to_float(q) * 2**24 == q  # exact


def test_log2_digits():
    for x in (1 << 46, 3 << 45, (1 << 47) - 1, 12345678901234567890):
        want = math.log2(x / 2**46)
        assert abs(log2_q(x, 40, 46) / 2**40 - want) < 1e-9
    with pytest.raises(ValueError):
        log2_q(5, 40, 46)
