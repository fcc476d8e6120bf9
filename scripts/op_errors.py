"""Error of each integer op against float, layer by layer, on real activations.

Runs the integer spec (python/intdet/ref, bit-identical to the C++ core) and
the float32 reference side by side on the same tokens, records every named
intermediate (tok_embd, blk.N.attn_norm, attn_q/k/v, attn_out, attn_output,
ffn_norm, ffn_gate, ffn_up, ffn_swiglu, ffn_down, residual, output) and prints
the relative error ||int - float|| / ||float|| of each. The errors are
cumulative (each side runs its own forward pass), so a regression shows as a
jump at the op that caused it.

The tokens start with BOS when the tokenizer adds one (Gemma 3), as
`intdet perplexity`'s windows do; --no-bos leaves it out (Gemma 3 without BOS
is off its training distribution: its first token becomes the attention sink,
and the errors grow several-fold).

Usage: python scripts/op_errors.py [-m MODEL] [--converted DIR] [--file TEXT] [--tokens 64] [--layers 0,1,15,29]
           [--no-bos]
"""

from __future__ import annotations

import argparse
import math
import os

import numpy as np

from intdet.convert.sources import read_source
from intdet.floatref import FloatModel
from intdet.model import load_model
from intdet.ref.model import RefModel
from intdet.resolve import converted_path, default_model_path
from intdet.tokenizer import encode

OPS = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_out", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
       "ffn_swiglu", "ffn_down", "residual"]
SAMPLE = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based ink and a wooden press adapted from those used to make wine. Within fifty "
    "years, presses were running in more than two hundred cities across Europe, and the price of books fell "
    "so far that reading spread from monasteries and courts to merchants, artisans and students."
)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file or HF dir (default: SmolLM2-135M)")
    ap.add_argument("--file", default=None, help="UTF-8 text (default: a built-in English paragraph)")
    ap.add_argument("--converted", default=None, help="the converted directory of -m (default: convert it into the cache)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--layers", default=None, help="comma-separated layer indices (default: all)")
    ap.add_argument("--no-bos", action="store_true", help="no BOS first, even when the tokenizer adds one")
    ap.add_argument("--per-position", action="store_true",
                    help="also the logits' relative error at each position, with its token")
    a = ap.parse_args()
    src = a.model or default_model_path()
    lm = load_model(a.converted or converted_path(src, progress=False))
    fm = read_source(src)
    if a.file:  # bytes: a CRLF file keeps its CRs, as `intdet perplexity` reads it
        with open(a.file, "rb") as f:
            text = f.read().decode("utf-8")
    else:
        text = SAMPLE
    ids = encode(lm.tokenizer, lm.tok_meta, text, add_bos=False if a.no_bos else None)[: a.tokens]
    cfg = dict(lm.cfg, context_length=len(ids))
    t = dict(lm.tensors)
    for r in ("rope", "rope_local"):  # rope_local: Gemma's local layers
        if r + ".cos" in t:
            t[r + ".cos"], t[r + ".sin"] = t[r + ".cos"][: len(ids)], t[r + ".sin"][: len(ids)]
    # Exponent G of each gamma, from the stored int16 gammas and the float ones.
    cfg["norm_gamma_exponents"] = {
        k[:-2]: int(round(math.log2(np.abs(t[k]).max() / np.abs(fm.weights[k[:-2]]).max())))
        for k in t if k.endswith("norm.g")
    }
    ti, tf = {}, {}
    RefModel(cfg, t).forward(ids, 0, trace=ti)
    FloatModel(fm, np.float32, max_len=len(ids)).forward(np.array(ids), 0, trace=tf)

    def rel(name):
        ia, f = ti[name]
        x, y = ia.astype(np.float64) * f, tf[name].astype(np.float64).reshape(ia.shape)
        return float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30))

    layers = [int(v) for v in a.layers.split(",")] if a.layers else range(lm.cfg["num_layers"])
    print(f"model: {os.path.basename(src)}  tokens: {len(ids)} (first {ids[0]})  "
          "relative error ||int - float|| / ||float|| (cumulative)")
    print(f"tok_embd: {rel('tok_embd'):.2e}")
    print("layer " + " ".join(f"{o:>11}" for o in OPS))
    for i in layers:
        print(f"{i:5d} " + " ".join(f"{rel(f'blk.{i}.{o}'):11.2e}" for o in OPS))
    print(f"output (logits): {rel('output'):.2e}")
    if a.per_position:
        ia, f = ti["output"]
        x, y = ia.astype(np.float64) * f, tf["output"].astype(np.float64).reshape(ia.shape)
        err = np.linalg.norm(x - y, axis=-1) / np.maximum(np.linalg.norm(y, axis=-1), 1e-30)
        print("position token logits-error")
        for j, (t, e) in enumerate(zip(ids, err)):
            print(f"{j:8d} {lm.tokenizer.id_to_token(int(t))!r:>16} {e:.2e}")


if __name__ == "__main__":
    main()
