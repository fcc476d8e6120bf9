"""The integer probability table of ``intdet compress``: the spec.

From the int32 logits z [V] of the next token (Q16 nats, as every engine
returns them) to integer frequencies f [V] that sum to exactly 2^P, each at
least 1, in exact integer arithmetic (docs/compress.md):

1. d_i = min(max(z) - z_i, DIFF_CAP)                 (int64, Q16 nats; the cap keeps step 2 in int64)
2. u_i = round_shift(d_i * LOG2E_Q30, 30)            (Q16 log2 units: d * log2(e))
3. w_i = exp2_neg_q30(u_i)                           (Q30, so 2^(-u_i) relative to the argmax, whose w is 2^30;
                                                      0 once u_i >= 31 * 2^16)
4. W = sum w_i                                       (int64: 2^30 <= W <= V * 2^30 <= 2^52)
5. M = floor((2^P - V) * 2^32 / W)                   (one division per table; M <= 2^32)
6. f_i = 1 + floor(w_i * M / 2^32)                   (w_i * M <= 2^62; sum f_i <= V + (2^P - V))
7. f[argmax] += 2^P - sum f                          (argmax: lowest id among the largest logits)

This is a softmax at temperature 1 (exp2 of ref/intmath: shift plus the
frozen degree-6 polynomial, I-LLM's DI-Exp form, arXiv 2405.17849) with
every token floored at 1 / 2^P; M is (2^P - V) / W to 32 fractional bits,
so no per-token division is needed. At P = 28 and V = 49,152 the floor takes
V / 2^28 = 0.018% of the mass (at most 0.00026 bit per token).
The C++ twin is csrc/compress/freq_table.h (``intdet._core.compress.freq_table``),
equal bit for bit (tests/compress/test_compress_table.py).
"""

from __future__ import annotations

import numpy as np

from ..ref.intmath import LOG2E_Q30, exp2_neg_q30, round_shift

PRECISION = 28  # the frequencies of a table total 2^PRECISION (format version 1)
MIN_PRECISION, MAX_PRECISION = 24, 30  # what the coder allows (range >= 2^40: r = range >> P >= 2^10)
MAX_VOCAB = 1 << 22
DIFF_CAP = 1 << 26  # Q16 logit gap beyond which the weight is 0 anyway (as sampling.py)


def freq_table(logits, precision: int = PRECISION) -> np.ndarray:
    """Frequencies int64 [..., V] of int32 logits [..., V] (Q16 nats), each row
    summing to 2^precision, every entry >= 1, by steps 1-7 above.

    Raises ValueError for V outside [1, 2^22] or precision outside [24, 30].
    """
    z = np.asarray(logits, dtype=np.int64)
    V = z.shape[-1]
    if not 1 <= V <= MAX_VOCAB:
        raise ValueError(f"vocab size {V} outside [1, 2^22]")
    if not MIN_PRECISION <= precision <= MAX_PRECISION:
        raise ValueError(f"precision {precision} outside [{MIN_PRECISION}, {MAX_PRECISION}]")
    top = z.max(axis=-1, keepdims=True)
    d = np.minimum(top - z, DIFF_CAP)
    u = round_shift(d * LOG2E_Q30, 30)
    w = exp2_neg_q30(u)
    W = w.sum(axis=-1, keepdims=True)
    total = 1 << precision
    M = ((total - V) << 32) // W
    f = 1 + ((w * M) >> 32)
    arg = np.argmax(z, axis=-1)  # lowest id on ties
    rem = total - f.sum(axis=-1)
    np.put_along_axis(f, arg[..., None], np.take_along_axis(f, arg[..., None], -1) + rem[..., None], -1)
    return f
