"""Integer logits against the float reference on real text.

Runs the integer engine (C++ core) and the numpy float32 reference of the
same architecture on the same dequantized weights, over N positions of a text
file, and prints top-1 agreement and the mean KL(float || integer) of the
next-token distributions, plus both perplexities over the same tokens.
The windows are `intdet perplexity`'s (intdet.perplexity.windows_of: --ctx
tokens each, from an empty KV cache, BOS first in each when the tokenizer
adds one, as Gemma 3's does); a position is one prediction (a window gives
ctx - 1), so the perplexities are those of `intdet perplexity --max-windows`.
Analysis code: float is allowed here.

Usage: python scripts/compare_float.py [-m MODEL] [--source SRC] [--file F] [--positions 2000] [--ctx 512]

Gemma 3 270M: -m gemma-3-270m-q4_k_m.gguf (or -m its converted directory
with --source the GGUF, to skip the conversion).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from intdet.convert.sources import read_source
from intdet.floatref import FloatModel
from intdet.model import Engine, load_model
from intdet.perplexity import window_bos, windows_of
from intdet.resolve import default_model_path, resolve_model
from intdet.tokenizer import encode

DEFAULT_FILE = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "wikitext-2-raw-test.txt")


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file or HF dir (default: SmolLM2-135M)")
    ap.add_argument("--source", default=None,
                    help="float weights' source (GGUF / HF dir) when -m is a converted directory (default: -m)")
    ap.add_argument("--file", default=DEFAULT_FILE)
    ap.add_argument("--positions", type=int, default=2000)
    ap.add_argument("--ctx", type=int, default=512)
    a = ap.parse_args()
    src = a.model or default_model_path()
    lm = load_model(resolve_model(src, progress=False))
    eng = Engine(lm, "cpu")
    flt = FloatModel(read_source(a.source or src), np.float32, max_len=a.ctx)
    with open(a.file, "rb") as f:
        text = f.read().decode("utf-8")
    ids = encode(lm.tokenizer, lm.tok_meta, text, add_bos=False)
    wins = windows_of(ids, a.ctx, bos=window_bos(lm.tok_meta))
    agree = kl = nll_i = nll_f = 0.0
    n = 0
    t_int = t_flt = 0.0
    for win in wins:
        if n >= a.positions:
            break
        t = time.perf_counter()
        li = eng.new_state(len(win)).forward(win, all_logits=True).astype(np.float64) / 65536.0
        t_int += time.perf_counter() - t
        t = time.perf_counter()
        flt.reset()
        lf = flt.forward(np.array(win), 0).astype(np.float64)
        t_flt += time.perf_counter() - t
        k = min(len(win) - 1, a.positions - n)  # predictions: position j predicts win[j + 1]
        pi, pf = log_softmax(li[:k]), log_softmax(lf[:k])
        agree += float((li[:k].argmax(-1) == lf[:k].argmax(-1)).sum())
        kl += float((np.exp(pf) * (pf - pi)).sum())
        tgt = np.array(win[1:k + 1])
        wi = -float(pi[np.arange(k), tgt].sum())
        wf = -float(pf[np.arange(k), tgt].sum())
        nll_i += wi
        nll_f += wf
        n += k
        print(f"  {n} positions: top-1 agreement {agree / n:.2%}; this window: perplexity integer "
              f"{np.exp(wi / k):.3f}, float32 {np.exp(wf / k):.3f}", file=sys.stderr)
    scored = n
    bos = "BOS + " if window_bos(lm.tok_meta) is not None else ""
    print(f"model: {os.path.basename(src)}  text: {os.path.basename(a.file)}  positions: {n} "
          f"(windows of {bos}{a.ctx - bool(bos)} text tokens)")
    print(f"top-1 agreement (integer vs float32): {agree / n:.2%}")
    print(f"mean KL(float || integer): {kl / n:.5f} nats")
    print(f"perplexity over the same tokens: integer {np.exp(nll_i / max(scored, 1)):.3f}, "
          f"float32 {np.exp(nll_f / max(scored, 1)):.3f}")
    print(f"time: integer (C++ core) {t_int:.1f} s, float32 (numpy) {t_flt:.1f} s")


if __name__ == "__main__":
    main()
