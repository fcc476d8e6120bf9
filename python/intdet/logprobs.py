"""Fixed-point log-softmax of int32 logits: log-probabilities that are the
same bits on every machine.

``math.log``/``numpy.log`` of a float may differ in the last bit between libm
versions and platforms; this computes log p_i = (l_i - m) - ln Z exactly in
integers (Python ints and int64 numpy arrays), then a JSON number is the
exact quotient ``q / 2^LOGPROB_FRAC_BITS`` (a double represents it exactly,
and Python prints doubles with the same shortest-round-trip digits
everywhere).

Formats:
  logits l_j: int32 Q16 nats (the engine's output, ``logit_frac_bits`` 16).
  a_j = round((m - l_j) * log2(e)) in Q16 log2 units, m = max_j l_j, with
      log2(e) in Q30 (``LOG2E_Q30``, as the sampler); gaps above 1024 nats
      are capped (such terms are 0 at Q46 anyway).
  w_j = 2^(-a_j / 2^16) in Q46: the fraction through ``exp2_neg_q30`` (the
      one exp2 primitive, ref/intmath.py), the integer part a rounding right
      shift by 16 bits less, so small weights keep 16 more bits than the
      sampler's Q30 weights; w_max = 2^46 exactly. Z = sum_j w_j (a Python
      int; the int64 sum is split in two halves so no vocabulary overflows).
  log2(Z / 2^46) in Q40 by the digit-by-digit squaring method (each squaring
      on a Q62 mantissa, truncated), ln Z = log2 Z * ln 2 with ln 2 in Q64.
  log p_i in Q24 nats (``LOGPROB_FRAC_BITS``): -((m - l_i) << 8) - round(ln Z).

Error bound against the real log-softmax of the same int32 logits (what a
float64 log-sum-exp of l / 2^16 gives up to its own rounding): |error| <=
2^-17 * ln 2 (rounding of a_j: a relative error of every weight, so of Z)
+ 2^-29 (exp2_neg_q30: one Q30 unit on a value >= 2^29) + V * 2^-46
(weights below Q46, at most 2^-29 for V <= 2^17) + 2^-32 (log2(e) in Q30 on
the gaps that matter, a_j < 48) + 2^-38 (the log2 digits) + 2^-25 (rounding
to Q24) < 6.0e-6 nats; ``ERROR_BOUND`` states it and
tests/api/test_api_logprobs.py checks it on random logits. The order of
log-probabilities is the order of the logits (ties equal), so "is the chosen
token the most likely" is exact.

The log-probabilities are those of the model's distribution (the raw logits,
before temperature, top-k/top-p or the repetition penalty), as vLLM and the
OpenAI API report them. The behaviour log-probability (the distribution the
sampler actually drew from: sampling.py ``Sampler.behaviour_logprob_q``) is
``ratio_logprob_q(w, total)``: ln(w / total) of two positive integers in the
same Q24 format, from the same ``log2_q`` digits and ln 2 constant:
-round((log2_Q40(total) - log2_Q40(w)) * ln2_Q64 / 2^80), each log2 of an
integer >= 1 in Q40 (error < 2^-39 each), so |error| < 2^-37 + 2^-25 nats.
"""

from __future__ import annotations

import numpy as np

from .ref.intmath import LOG2E_Q30, exp2_neg_q30, round_shift

LOGPROB_FRAC_BITS = 24  # output format: log-probability in nats = q / 2^24
MAX_LOGPROBS = 20  # top tokens per position at most, in the API and the server (vLLM's default max_logprobs)
W_BITS = 46  # weights w_j in Q46
LOG2_FRAC_BITS = 40  # log2(Z) digits
LN2_Q64 = 12786308645202655660  # round(ln(2) * 2^64), checked against Decimal in the tests
DIFF_CAP = 1 << 26  # Q16 logit gaps above 1024 nats: weight 0 at Q46 (2^-1477)
ERROR_BOUND = 6.0e-6  # nats, see the module docstring
ROW_CHUNK = 32  # rows of a [T, V] array per numpy pass (bounds the int64 temporaries)


def log2_q(x: int, frac_bits: int, int_bits_of_one: int) -> int:
    """floor-ish log2(x / 2^int_bits_of_one) in Q``frac_bits`` for a Python
    int x >= 2^int_bits_of_one (so the result is >= 0). Digit-by-digit:
    normalize the mantissa to [1, 2) in Q62, square it once per fraction
    bit, and a square >= 2 gives a 1 digit (then halve). Truncating each
    square keeps the error below 2^(1 - frac_bits) for frac_bits <= 40."""
    n = x.bit_length() - 1
    if n < int_bits_of_one:
        raise ValueError("log2_q needs x >= 2^int_bits_of_one")
    y = x << (62 - n) if n <= 62 else x >> (n - 62)  # mantissa in [2^62, 2^63)
    frac = 0
    for _ in range(frac_bits):
        y = (y * y) >> 62
        frac <<= 1
        if y >= 1 << 63:
            y >>= 1
            frac |= 1
    return ((n - int_bits_of_one) << frac_bits) | frac


def ratio_logprob_q(w: int, total: int) -> int:
    """ln(w / total) in Q``LOGPROB_FRAC_BITS`` (an int <= 0) for Python ints
    1 <= w <= total: the difference of the two Q40 base-2 logarithms
    (``log2_q``), times ln 2 in Q64, rounded half up to Q24 (the module
    docstring's behaviour log-probability). w == total gives exactly 0.
    Raises ValueError outside that range."""
    w, total = int(w), int(total)
    if not 1 <= w <= total:
        raise ValueError(f"ratio_logprob_q needs 1 <= w <= total, not w={w}, total={total}")
    d = log2_q(total, LOG2_FRAC_BITS, 0) - log2_q(w, LOG2_FRAC_BITS, 0)  # >= 0: log2 is monotone here
    shift = 64 + LOG2_FRAC_BITS - LOGPROB_FRAC_BITS
    return -((d * LN2_Q64 + (1 << (shift - 1))) >> shift)


def _ln_z_q(gaps: np.ndarray) -> np.ndarray:
    """ln Z in Q``LOGPROB_FRAC_BITS`` for each row of ``gaps`` (int64 [R, V],
    m - l_j >= 0, with a 0 in every row). Returns int64 [R]."""
    d = np.minimum(gaps, DIFF_CAP)
    a = round_shift(d * LOG2E_Q30, 30)  # Q16 log2 units, |d * LOG2E_Q30| < 2^57
    i = a >> 16
    p = exp2_neg_q30(a & 0xFFFF)  # Q30 in (2^29, 2^30]
    # 2^-i * p in Q46 = round(p * 2^16 / 2^i); zero once i >= 48 (p * 2^16 <= 2^46)
    w = np.where(i >= 48, 0, round_shift(p << 16, np.minimum(i, 47)))
    hi, lo = (w >> 23).sum(axis=1), (w & ((1 << 23) - 1)).sum(axis=1)
    out = np.empty(len(gaps), dtype=np.int64)
    for r in range(len(gaps)):
        z = (int(hi[r]) << 23) + int(lo[r])  # Python int: exact for any vocabulary
        l2 = log2_q(z, LOG2_FRAC_BITS, W_BITS)  # Q40 log2 units
        shift = 64 + LOG2_FRAC_BITS - LOGPROB_FRAC_BITS
        out[r] = (l2 * LN2_Q64 + (1 << (shift - 1))) >> shift
    return out


class LogSoftmax:
    """Log-probabilities of one or more rows of int32 Q16 logits.

    ``LogSoftmax(logits)`` with logits int32 [V] or [R, V]. ``q[r]`` (int64
    [R, V], computed on demand per row) would be large, so the object keeps
    only each row's max and ln Z; ``logprob_q(r, token)`` is the chosen
    token's Q24 log-probability and ``top(r, k)`` the k most likely tokens as
    [(id, q)], larger logit first, lower id first on ties.
    """

    def __init__(self, logits: np.ndarray):
        lg = np.asarray(logits)
        if lg.dtype != np.int32:
            raise TypeError(f"logits must be int32 (Q16), not {lg.dtype}")
        self.logits = lg.reshape(1, -1) if lg.ndim == 1 else lg
        if self.logits.ndim != 2 or self.logits.shape[1] == 0:
            raise ValueError(f"logits must be [V] or [R, V] with V > 0, not {lg.shape}")
        self.max = self.logits.max(axis=1).astype(np.int64)
        self.ln_z = np.empty(len(self.logits), dtype=np.int64)
        for s in range(0, len(self.logits), ROW_CHUNK):
            rows = self.logits[s:s + ROW_CHUNK].astype(np.int64)
            self.ln_z[s:s + ROW_CHUNK] = _ln_z_q(self.max[s:s + ROW_CHUNK, None] - rows)

    def __len__(self) -> int:
        return len(self.logits)

    def logprob_q(self, row: int, token: int) -> int:
        """Q24 log-probability (int, <= 0) of ``token`` under row ``row``."""
        gap = int(self.max[row]) - int(self.logits[row, token])
        return -(gap << (LOGPROB_FRAC_BITS - 16)) - int(self.ln_z[row])

    def top(self, row: int, k: int) -> list:
        """The ``k`` most likely tokens of row ``row`` as [(id, Q24 logprob)]."""
        lg = self.logits[row]
        k = max(0, min(int(k), len(lg)))
        if k == 0:
            return []
        cand = np.argpartition(-lg.astype(np.int64), k - 1)[:k] if k < len(lg) else np.arange(len(lg))
        # argpartition may cut a tie at the k-th value anywhere: take every id tied with it
        kth = lg[cand].min()
        cand = np.flatnonzero(lg >= kth)
        order = cand[np.lexsort((cand, -lg[cand].astype(np.int64)))][:k]
        return [(int(t), self.logprob_q(row, int(t))) for t in order]


def to_float(q: int) -> float:
    """A Q24 log-probability as a float: the exact quotient q / 2^24."""
    return q / (1 << LOGPROB_FRAC_BITS)
