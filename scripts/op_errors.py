"""Error of each integer op against float, layer by layer, on real activations.

Runs the integer spec (python/intdet/ref, bit-identical to the C++ core) and
the float32 reference side by side on the same tokens, records every named
intermediate (tok_embd, blk.N.attn_norm, attn_q/k/v, attn_out, attn_output,
ffn_norm, ffn_gate, ffn_up, ffn_swiglu, ffn_down, residual, output) and prints
the relative error ||int - float|| / ||float|| of each. The errors are
cumulative (each side runs its own forward pass), so a regression shows as a
jump at the op that caused it.

Usage: python scripts/op_errors.py [-m MODEL] [--converted DIR] [--file TEXT] [--tokens 64] [--layers 0,1,15,29]
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
    a = ap.parse_args()
    src = a.model or default_model_path()
    lm = load_model(a.converted or converted_path(src, progress=False))
    fm = read_source(src)
    text = open(a.file, encoding="utf-8").read() if a.file else SAMPLE
    ids = encode(lm.tokenizer, lm.tok_meta, text, add_bos=False)[: a.tokens]
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
    print(f"model: {os.path.basename(src)}  tokens: {len(ids)}  relative error ||int - float|| / ||float|| (cumulative)")
    print(f"tok_embd: {rel('tok_embd'):.2e}")
    print("layer " + " ".join(f"{o:>11}" for o in OPS))
    for i in layers:
        print(f"{i:5d} " + " ".join(f"{rel(f'blk.{i}.{o}'):11.2e}" for o in OPS))
    print(f"output (logits): {rel('output'):.2e}")


if __name__ == "__main__":
    main()
