"""Integer sampling from int32 logits: repetition penalty, greedy,
temperature, top-k, top-p, min-p.

Everything is integer so a seed gives the same token on every machine:
- the repetition penalty (llama.cpp's ``--repeat-penalty``) comes first and
  applies to greedy decoding too: every distinct token among the last
  ``repeat_last_n`` ids (prompt and generated, -1 = all) has its Q16 logit l
  divided by the penalty when l > 0 and multiplied by it otherwise. The
  penalty is an exact decimal r = r_num / r_den (at most 6 places, in
  (0, 100]); l' = round_div(l * r_den, r_num) for l > 0, else
  -round_div(-l * r_num, r_den) (round half away from zero, Python ints, no
  float); 1 = off;
- weights w_i = 2^(-u_i) in Q30 with u_i = (max - l_i) * log2(e) / T in Q16
  (temperature folded into the exp argument; ``exp2_neg_q30`` of ref/intmath);
- top-k keeps the k largest logits, lower token id first on ties;
- top-p keeps the shortest prefix (in that order) whose weight reaches p,
  compared by cross-multiplication (p is an exact decimal fraction);
- min-p keeps, of what top-k and top-p left, the tokens whose Q30 weight w_i
  satisfies w_i * m_den >= m_num * w_max (w_max = 2^30, the most likely
  token's weight; m = m_num / m_den an exact decimal in [0, 1], 0 = off), so
  p_i >= m * p_max exactly, after temperature as in Hugging Face;
- the draw is SplitMix64 (Steele et al. 2014) keyed by (seed, absolute
  position), so batching and prefill splits cannot change it; the pick is the
  integer inverse CDF: first i with cumsum_i > floor(r * total / 2^64).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

import numpy as np

from .errors import IntdetError
from .logprobs import ratio_logprob_q
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
    naming the field ``name`` when it is not a number in range."""
    try:
        d = Decimal(str(text))
    except InvalidOperation:
        raise IntdetError(f"{name}: {text!r} is not a number", field=name) from None
    if not d.is_finite() or d < lo or d > hi or (lo_open and d == lo):
        raise IntdetError(f"{name}: {text} is outside {'(' if lo_open else '['}{lo}, {hi}]", field=name)
    n, den = d.as_integer_ratio()
    if den > 10**6:
        raise IntdetError(f"{name}: {text} has more than 6 decimal places", field=name)
    return n, den


def apply_repeat_penalty(logits: np.ndarray, recent, r_num: int, r_den: int) -> np.ndarray:
    """llama.cpp's repetition penalty on Q16 logits (int64 copy returned):
    each distinct id in ``recent`` gets l / r when l > 0, l * r otherwise,
    r = r_num / r_den, rounded half away from zero in exact integers."""
    out = np.array(logits, dtype=np.int64)
    if r_num == r_den:
        return out
    for t in sorted({int(t) for t in recent if 0 <= int(t) < len(out)}):
        v = int(out[t])
        out[t] = (2 * v * r_den + r_num) // (2 * r_num) if v > 0 else -((-2 * v * r_num + r_den) // (2 * r_den))
    return out


@dataclass
class Sampler:
    """temperature 0 (or None) means greedy. top_k 0 = off; top_p 1 = off;
    min_p 0 = off; repeat_penalty 1 = off (over the last repeat_last_n ids,
    -1 = all, 0 = off)."""

    temperature: str | float | None = None
    top_k: int = 0
    top_p: str | float = "1"
    seed: int = 0
    min_p: str | float = "0"
    repeat_penalty: str | float = "1"
    repeat_last_n: int = 64

    def __post_init__(self):
        t = "0" if self.temperature is None else self.temperature
        self.t_num, self.t_den = parse_fraction(t, "temperature", Decimal(0), Decimal(100))
        self.p_num, self.p_den = parse_fraction(self.top_p, "top_p", Decimal(0), Decimal(1), lo_open=True)
        self.m_num, self.m_den = parse_fraction(self.min_p, "min_p", Decimal(0), Decimal(1))
        self.r_num, self.r_den = parse_fraction(self.repeat_penalty, "repeat_penalty", Decimal(0), Decimal(100),
                                                lo_open=True)
        for name in ("top_k", "repeat_last_n", "seed"):
            v = getattr(self, name)  # an int (numpy's too), not a bool, a float or None: "& MASK64" needs one
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise IntdetError(f"{name}: {v!r} is not an integer", field=name)
            setattr(self, name, int(v))
        if self.top_k < 0:
            raise IntdetError(f"top_k: {self.top_k} must be >= 0", field="top_k")
        if not -1 <= self.repeat_last_n < 2**31:
            raise IntdetError(f"repeat_last_n: {self.repeat_last_n} must be >= -1 (-1 = the whole context, 0 = off)",
                              field="repeat_last_n")
        if not 0 <= self.seed < 2**64:
            raise IntdetError(f"seed: {self.seed} must be in [0, 2^64)", field="seed")

    @property
    def greedy(self) -> bool:
        return self.t_num == 0

    @property
    def penalized(self) -> bool:
        return self.r_num != self.r_den and self.repeat_last_n != 0

    @property
    def device_ok(self) -> bool:
        """Whether the CUDA engine can choose this sampler's tokens on the
        device: greedy, or temperature with any top-k, top-p and min-p
        (kernels_sample.cu sample_kernel); not with a repetition penalty (it changes
        the logits first; the host applies it)."""
        return not self.penalized

    def recent(self, history) -> list:
        """The ids the repetition penalty looks at: the last repeat_last_n of ``history``."""
        if not self.penalized or not history:
            return []
        return list(history) if self.repeat_last_n < 0 else list(history[-self.repeat_last_n:])

    def pick(self, logits: np.ndarray, position: int, history=(), allowed: np.ndarray | None = None) -> int:
        """logits: int32 [V] (Q16); position: the absolute position of the
        token being chosen (keys the draw); history: the ids so far (prompt
        and generated) for the repetition penalty; allowed: None, or bool [V]
        (structured output's mask): the pick is made over the allowed ids
        alone, exactly as if the others were not in the vocabulary (after
        the repetition penalty; top-k, top-p and min-p count allowed ids
        only). Returns the chosen id. Raises IntdetError if no id is
        allowed."""
        if self.penalized:
            logits = apply_repeat_penalty(logits, self.recent(history), self.r_num, self.r_den)
        if allowed is not None and not allowed.any():
            raise IntdetError("structured output: the grammar allows no token here")
        return self._choose(logits, position, allowed)

    def pick_logprob(self, logits: np.ndarray, position: int, history=(),
                     allowed: np.ndarray | None = None) -> tuple[int, int]:
        """``pick``'s id and its behaviour log-probability (Q24, see
        ``behaviour_logprob_q``) from the one distribution both come from."""
        if self.penalized:
            logits = apply_repeat_penalty(logits, self.recent(history), self.r_num, self.r_den)
        if allowed is not None and not allowed.any():
            raise IntdetError("structured output: the grammar allows no token here")
        order, cum = self._support(logits, allowed)
        i = self._draw(cum, position)
        return int(order[i]), _weight_logprob_q(cum, i)

    def behaviour_logprob_q(self, logits: np.ndarray, token: int, history=(),
                            allowed: np.ndarray | None = None):
        """The log-probability of ``token`` under the distribution this
        sampler draws from at this step (the behaviour policy of RL), Q24
        nats (logprobs.py): with w the Q30 weights left after the repetition
        penalty, temperature, the mask, top-k, top-p and min-p, and total =
        sum(w) over that kept set, ln(w_token / total) by
        ``logprobs.ratio_logprob_q`` (the draw picks token i with probability
        w_i / total, up to the 64-bit draw's own rounding, < total / 2^64).
        Greedy: 0 for the argmax. None when ``token`` is outside the kept set
        (probability 0: a forced token the sampler could not draw). The
        arguments are ``pick``'s (no position: the distribution does not
        depend on it, only the draw)."""
        if self.penalized:
            logits = apply_repeat_penalty(logits, self.recent(history), self.r_num, self.r_den)
        if allowed is not None and not allowed.any():
            return None
        order, cum = self._support(logits, allowed)
        hit = np.flatnonzero(order == int(token))
        if not len(hit) or (int(cum[hit[0]]) - (int(cum[hit[0] - 1]) if hit[0] else 0)) == 0:
            return None
        return _weight_logprob_q(cum, int(hit[0]))

    def _choose(self, logits: np.ndarray, position: int, allowed: np.ndarray | None = None) -> int:
        """The pick from (penalized) logits, over the allowed ids when a mask
        is given: the same id as picking from logits[ids] (ids = the allowed
        ids, ascending) and mapping back, without building that copy."""
        order, cum = self._support(logits, allowed)
        return int(order[self._draw(cum, position)])

    def _draw(self, cum: np.ndarray, position: int) -> int:
        """The index into the kept set that the draw at ``position`` selects."""
        if len(cum) == 1:
            return 0
        total = int(cum[-1])
        target = (draw_u64(self.seed, position) * total) >> 64
        return int(np.searchsorted(cum, target, side="right"))

    def _support(self, logits: np.ndarray, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The kept set the draw is made over: (ids in draw order, int64
        cumulative Q30 weights), both of one length >= 1. Greedy: the argmax
        alone, weight 1."""
        best = int(np.argmax(logits))  # lowest id wins ties
        if allowed is not None and not allowed[best]:  # the model's favourite is not allowed: the largest allowed logit
            best = int(np.argmax(np.where(allowed, np.asarray(logits, dtype=np.int64), np.iinfo(np.int64).min)))
        if self.greedy:
            return np.array([best]), np.array([1], dtype=np.int64)
        logits = np.asarray(logits, dtype=np.int64)
        # Only tokens whose weight can be non-zero matter: exp2_neg_q30 is 0
        # once u >= 31 * 2^16. Filtering them first keeps the sort small and
        # changes nothing (weights are non-increasing along the order).
        top = int(logits[best])
        d_all = np.minimum(np.maximum(top - logits, 0), DIFF_CAP)  # masked-out ids above top: filtered below
        keep = round_div(round_shift(d_all * LOG2E_Q30, 30) * self.t_den, self.t_num) < (31 << 16)
        live = np.flatnonzero(keep if allowed is None else keep & allowed)
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
        if self.m_num:
            # keep w_i * m_den >= m_num * 2^30 (w[0] = 2^30 is the largest);
            # w is non-increasing, so that is a prefix, never empty
            n = int(np.count_nonzero(w[:len(cum)] * self.m_den >= self.m_num << 30))
            cum = cum[:max(n, 1)]
        return order[:len(cum)], cum


def _weight_logprob_q(cum: np.ndarray, i: int) -> int:
    """ln(w_i / total) in Q24 of the kept set's cumulative weights ``cum``."""
    w = int(cum[i]) - (int(cum[i - 1]) if i else 0)
    return ratio_logprob_q(w, int(cum[-1]))
