"""Integer sampling from int32 logits: greedy, temperature, top-k, top-p.

Everything is integer so a seed gives the same token on every machine:
- weights w_i = 2^(-u_i) in Q30 with u_i = (max - l_i) * log2(e) / T in Q16
  (temperature folded into the exp argument; ``exp2_neg_q30`` of ref/intmath);
- top-k keeps the k largest logits, lower token id first on ties;
- top-p keeps the shortest prefix (in that order) whose weight reaches p,
  compared by cross-multiplication (p is an exact decimal fraction);
- the draw is SplitMix64 (Steele et al. 2014) keyed by (seed, absolute
  position), so batching and prefill splits cannot change it; the pick is the
  integer inverse CDF: first i with cumsum_i > floor(r * total / 2^64).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

import numpy as np

from .errors import IntdetError
from .ref.intmath import LOG2E_Q30, exp2_neg_q30, round_div, round_shift

MASK64 = (1 << 64) - 1
DIFF_CAP = 1 << 26  # logit gaps beyond 1024 (Q16) give weight 0 anyway


def splitmix64(x: int) -> int:
    """SplitMix64 finalizer of a 64-bit state (Python ints, wrapping)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def draw_u64(seed: int, position: int) -> int:
    """The random 64-bit value for sampling at an absolute position."""
    return splitmix64((splitmix64(seed & MASK64) ^ (position & MASK64)) & MASK64)


def parse_fraction(text, name: str, lo: Decimal, hi: Decimal, lo_open=False) -> tuple[int, int]:
    """Exact decimal string -> (numerator, denominator); raises IntdetError
    naming the option when it is not a number in range."""
    try:
        d = Decimal(str(text))
    except InvalidOperation:
        raise IntdetError(f"{name}: {text!r} is not a number") from None
    if not d.is_finite() or d < lo or d > hi or (lo_open and d == lo):
        raise IntdetError(f"{name}: {text} is outside {'(' if lo_open else '['}{lo}, {hi}]")
    n, den = d.as_integer_ratio()
    if den > 10**6:
        raise IntdetError(f"{name}: {text} has more than 6 decimal places")
    return n, den


@dataclass
class Sampler:
    """temperature 0 (or None) means greedy. top_k 0 = off; top_p 1 = off."""

    temperature: str | float | None = None
    top_k: int = 0
    top_p: str | float = "1"
    seed: int = 0

    def __post_init__(self):
        t = "0" if self.temperature is None else self.temperature
        self.t_num, self.t_den = parse_fraction(t, "--temperature", Decimal(0), Decimal(100))
        self.p_num, self.p_den = parse_fraction(self.top_p, "--top-p", Decimal(0), Decimal(1), lo_open=True)
        if self.top_k < 0:
            raise IntdetError(f"--top-k: {self.top_k} must be >= 0")
        if not 0 <= self.seed < 2**64:
            raise IntdetError(f"--seed: {self.seed} must be in [0, 2^64)")

    @property
    def greedy(self) -> bool:
        return self.t_num == 0

    def pick(self, logits: np.ndarray, position: int) -> int:
        """logits: int32 [V] (Q16). Returns the chosen token id."""
        logits = np.asarray(logits, dtype=np.int64)
        if self.greedy:
            return int(np.argmax(logits))  # lowest id wins ties
        # Only tokens whose weight can be non-zero matter: exp2_neg_q30 is 0
        # once u >= 31 * 2^16. Filtering them first keeps the sort small and
        # changes nothing (weights are non-increasing along the order).
        top = int(logits.max())
        d_all = np.minimum(top - logits, DIFF_CAP)
        live = np.flatnonzero(round_div(round_shift(d_all * LOG2E_Q30, 30) * self.t_den, self.t_num) < (31 << 16))
        order = live[np.lexsort((live, -logits[live]))]  # logit desc, id asc
        if self.top_k:
            order = order[: self.top_k]
        lg = logits[order]
        d = np.minimum(lg[0] - lg, DIFF_CAP)
        a = round_shift(d * LOG2E_Q30, 30)  # Q16 log2 units
        u = round_div(a * self.t_den, self.t_num)  # divide by T = t_num / t_den
        w = exp2_neg_q30(u)  # Q30 weights, w[0] = 2^30
        cum = np.cumsum(w)
        if self.p_num != self.p_den:
            # smallest prefix with cum * p_den >= p_num * total, i.e.
            # cum >= ceil(total * p_num / p_den) (exact, in Python ints)
            need = -((-int(cum[-1]) * self.p_num) // self.p_den)
            n = int(np.searchsorted(cum, need, side="left")) + 1
            cum = cum[:n]
        total = int(cum[-1])
        target = (draw_u64(self.seed, position) * total) >> 64
        i = int(np.searchsorted(cum, target, side="right"))
        return int(order[i])
