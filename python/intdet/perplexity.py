"""Perplexity by the standard protocol (analysis code: float is allowed here).

The text is tokenized once (no BOS), cut into non-overlapping windows of
``ctx`` tokens (a shorter last window is dropped), and every window is run
from an empty KV cache. Each position but the last predicts the next token:
a window scores ctx - 1 tokens. A model whose tokenizer adds a BOS
(``add_bos_token``, e.g. Gemma 3) gets it at the start of every window: the
window is BOS + ctx - 1 text tokens and scores those ctx - 1 tokens (the
first one predicted from BOS alone). llama.cpp's perplexity also starts every
chunk with BOS for such models (it overwrites the chunk's first token);
without it Gemma 3 270M's first WikiText-2 window scores 35.7 instead of
14.8. Log-probabilities of the integer model come from its int32 logits (Q16) as log_softmax(logits / 2^16) in float64.
Perplexity = exp(mean NLL); bits per byte = sum NLL / ln 2 / UTF-8 bytes of
the scored windows' text.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .errors import IntdetError


@dataclass
class PplResult:
    perplexity: float
    nll: float  # mean negative log-likelihood, nats per token
    bits_per_byte: float
    tokens: int  # predicted (scored) tokens
    windows: int
    ctx: int
    seconds: float
    # llama.cpp's protocol: second half of each window only (None: --ctx 2 leaves no position there)
    perplexity_second_half: float | None = None
    tokens_second_half: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def window_bos(meta: dict) -> int | None:
    """The token that starts every window: the BOS id when the tokenizer
    adds one (``meta['add_bos_token']``), else None."""
    return int(meta["bos_token_id"]) if meta.get("add_bos_token") and meta.get("bos_token_id") is not None else None


def windows_of(ids, ctx: int, max_windows: int | None = None, bos: int | None = None):
    """Non-overlapping windows of exactly ``ctx`` tokens (list of lists);
    with ``bos``, each is [bos] + ctx - 1 consecutive text tokens."""
    if ctx < 2:
        raise IntdetError(f"ctx: {ctx} must be at least 2", field="ctx")
    step = ctx - (bos is not None)
    n = len(ids) // step
    if max_windows is not None:
        if max_windows < 1:
            raise IntdetError(f"max_windows: {max_windows} must be >= 1", field="max_windows")
        n = min(n, max_windows)
    if n == 0:
        raise IntdetError(f"ctx {ctx}: the text has {len(ids)} tokens, fewer than one window", field="ctx")
    head = [] if bos is None else [int(bos)]
    return [head + list(ids[i * step:(i + 1) * step]) for i in range(n)]


def _block_nll(logits, tgt, r0, r1, scale, buf, out):
    """Rows r0..r1-1 of position_nll into out, in buf (float64 [>= r1 - r0, V]).

    The same float64 operations as ``-log_softmax(x)[tgt]`` with x =
    logits * scale, in place: x - max, exp, the row's pairwise sum (numpy
    sums a contiguous row in the same order whatever array holds it), and
    x[tgt] - log(sum) for the target only, so the bits equal log_softmax's."""
    x = buf[: r1 - r0]
    np.multiply(logits[r0:r1], scale, out=x, dtype=np.float64)
    x -= x.max(axis=-1, keepdims=True)
    t = x[np.arange(r1 - r0), tgt[r0:r1]]
    np.exp(x, out=x)
    out[r0:r1] = -(t - np.log(x.sum(axis=-1)))


def position_nll(logits: np.ndarray, window, rows: int = 32, threads: int = 2) -> np.ndarray:
    """float64 [len(window) - 1]: -log p(window[j+1] | window[:j+1]) for every j.

    logits: [T, V], float (natural-log units) or the integer engine's int32
    Q16 logits (integer dtype: divided by 2^16). The log-softmax runs in
    float64 over ``rows`` rows at a time in a reused buffer, so a [512,
    262144] window never needs a float64 copy of the whole array (that copy
    cost more than the forward pass for Gemma 3's vocabulary), with the row
    blocks split over ``threads`` threads (numpy's ufuncs release the GIL;
    each row's result does not depend on the split)."""
    logits = np.asarray(logits)
    scale = 1.0 / 65536.0 if np.issubdtype(logits.dtype, np.integer) else 1.0
    tgt = np.asarray(window[1:], dtype=np.int64)
    n = len(tgt)
    out = np.empty(n, dtype=np.float64)
    starts = list(range(0, n, rows))
    nthreads = max(1, min(threads, len(starts)))

    def work(k):
        buf = np.empty((min(rows, n), logits.shape[1]), dtype=np.float64)
        for r0 in starts[k::nthreads]:
            _block_nll(logits, tgt, r0, min(r0 + rows, n), scale, buf, out)

    if nthreads == 1:
        work(0)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(nthreads) as ex:
            list(ex.map(work, range(nthreads)))
    return out


def window_nll(logits: np.ndarray, window, first: int = 0) -> float:
    """Sum of -log p(window[j+1] | window[:j+1]) for first <= j < len-1
    (logits as position_nll takes them)."""
    return float(position_nll(logits, window)[first:].sum())


def perplexity(logits_fn, windows, n_bytes_fn, progress: bool = True, second_half: bool = False) -> PplResult:
    """logits_fn(window) -> logits [len, V]: float in natural-log units, or
    int32 Q16 (the integer engine's; see window_nll).
    n_bytes_fn(window) -> UTF-8 bytes of that window's text. second_half
    scores only predictions from position ctx/2 on (llama.cpp's protocol)."""
    from tqdm import tqdm

    if second_half and windows and len(windows[0]) < 3:  # a window of 2 predicts one token, in its first half
        raise IntdetError(f"second_half: windows of {len(windows[0])} tokens leave no prediction in their second "
                          "half (use windows of 3 or more)", field="second_half")
    total_nll, total_tok, total_bytes = 0.0, 0, 0
    half_nll, half_tok = 0.0, 0
    t0 = time.perf_counter()
    bar = tqdm(windows, desc="perplexity", unit="win", disable=not progress)
    for w in bar:
        nll_w = position_nll(logits_fn(w), w)
        first = len(w) // 2 if second_half else 0
        total_nll += float(nll_w[first:].sum())
        total_tok += len(w) - 1 - first
        total_bytes += n_bytes_fn(w[first + 1:])
        half_nll += float(nll_w[len(w) // 2:].sum())
        half_tok += len(w) - 1 - len(w) // 2
        bar.set_postfix(ppl=f"{math.exp(total_nll / total_tok):.4f}")
    nll = total_nll / total_tok
    return PplResult(
        perplexity=math.exp(nll), nll=nll, bits_per_byte=total_nll / math.log(2) / max(total_bytes, 1),
        tokens=total_tok, windows=len(windows), ctx=len(windows[0]), seconds=time.perf_counter() - t0,
        perplexity_second_half=math.exp(half_nll / half_tok) if half_tok else None, tokens_second_half=half_tok,
    )


def integer_logits_fn(engine):
    """Window -> the integer engine's int32 Q16 logits [len, V] (window_nll
    divides by 2^16 row block by row block)."""

    def fn(w):
        seq = engine.new_state(len(w))
        return seq.forward(w, all_logits=True)

    return fn


def float_logits_fn(float_model):
    """Window -> float64 logits of the float reference (floatref.FloatModel)."""

    def fn(w):
        float_model.reset()
        return float_model.forward(np.asarray(w), 0).astype(np.float64)

    return fn
