#!/usr/bin/env python3
"""Prompt and decode speed against context length: intdet and llama.cpp side by side.

    python scripts/bench_context.py [--lengths 512,2048,4096,8192] [--threads 1,2]
                                    [--gen-tokens 32] [--repeats 1] [--json OUT]

For each length N and thread count T, ``--repeats`` rounds of [intdet,
llama.cpp] alternate (A B A B ...), each engine in a fresh subprocess: it
loads SmolLM2-135M-Instruct (intdet: its int8 conversion of the Q4_1 GGUF;
llama.cpp: the Q8_0 GGUF requantized from it, as scripts/bench_cpu.py makes
them), warms up, times one prompt of N ids (prompt processing, pp tok/s)
and ``--gen-tokens`` greedy decode steps continuing it (decode after N,
tg tok/s), and reports its peak RSS. The table gives medians and the ratios
intdet / llama.cpp (> 1: intdet faster; for RSS, bigger). N is capped at the
context length minus the decode steps (SmolLM2: 8,192).

The peer: ``llama-bench`` from ``--llama-bench`` (default
~/.cache/intdet/llama-bench/bin/llama-bench) when that file exists, run
with flash attention (-fa 1): pp from ``-p N -n 0``, tg from ``-p 0 -n G
-d N`` (decode at depth N); no RSS. Otherwise llama-cpp-python from
scripts/bench_cpu.py's venv (~/.cache/intdet/bench-venv), ``Llama(...,
flash_attn=True, n_batch=512)``. The timings are wall-clock: on a shared,
loaded machine they are noisy, hence the alternation and the medians.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULT_TAG = "BENCH_RESULT "  # the tag bench_cpu.run_worker reads
CACHE = os.environ.get("INTDET_CACHE", os.path.expanduser("~/.cache/intdet"))
DEFAULT_LLAMA_BENCH = os.path.join(CACHE, "llama-bench", "bin", "llama-bench")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@functools.lru_cache(maxsize=1)
def bench_cpu():
    """scripts/bench_cpu.py as a module (loaded once): its venv, model preparation and worker runner."""
    spec = importlib.util.spec_from_file_location("bench_cpu", os.path.join(HERE, "bench_cpu.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------ workers

def _peak_rss_bytes(spec: dict) -> int:
    mod_spec = importlib.util.spec_from_file_location("intdet_rss", spec["rss_py"])
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.peak_rss_bytes()


def worker_intdet(spec: dict) -> dict:
    from intdet.bench import run_bench
    from intdet.model import load_model

    lm = load_model(spec["model"])
    (row,) = run_bench(lm, gen_tokens=spec["gen"], threads=[spec["threads"]], prompt_ids=spec["ids"])
    return {"pp": row["prefill_tok_s"], "tg": row["decode_tok_s"], "rss": row["peak_rss_bytes"], "isa": row["isa"]}


def worker_llama(spec: dict) -> dict:
    import llama_cpp
    import numpy as np

    ids, gen, T = spec["ids"], spec["gen"], spec["threads"]
    llm = llama_cpp.Llama(spec["model"], n_ctx=len(ids) + gen + 8, n_threads=T, n_threads_batch=T, n_batch=512,
                          flash_attn=True, verbose=False)
    n_vocab = llm.n_vocab()

    def last_argmax() -> int:
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))))

    llm.eval(ids[:8])  # warm-up
    llm.eval([last_argmax()])
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    pp_s = time.perf_counter() - t0
    tok = last_argmax()
    t0 = time.perf_counter()
    for _ in range(gen):
        llm.eval([tok])
        tok = last_argmax()
    tg_s = time.perf_counter() - t0
    return {"pp": len(ids) / pp_s, "tg": gen / tg_s, "rss": _peak_rss_bytes(spec), "version": llama_cpp.__version__}


WORKERS = {"intdet": worker_intdet, "llama": worker_llama}


def run_worker(python: str, kind: str, spec: dict, timeout: float = 7200) -> dict:
    """One worker of this script, run the way bench_cpu runs its own."""
    return bench_cpu().run_worker(python, kind, spec, timeout=timeout, script=__file__)


def run_llama_bench(binary: str, model: str, n: int, gen: int, threads: int) -> dict:
    """pp at N and tg at depth N from llama-bench (flash attention on)."""
    def one(args):
        p = subprocess.run([binary, "-m", model, "-t", str(threads), "-fa", "1", "-r", "1", "-o", "json", *args],
                           capture_output=True, text=True, timeout=7200)
        if p.returncode != 0:
            raise SystemExit(f"llama-bench failed (exit {p.returncode}): {p.stderr[-2000:]}")
        return json.loads(p.stdout)[0]["avg_ts"]

    return {"pp": one(["-p", str(n), "-n", "0"]), "tg": one(["-p", "0", "-n", str(gen), "-d", str(n)]), "rss": None}


# --------------------------------------------------------------------- main

def fmt_ratio(a, b):
    return f"{a / b:.2f}" if a and b else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="512,2048,4096,8192", help="prompt lengths, comma separated")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma separated")
    ap.add_argument("--gen-tokens", type=int, default=32, help="decode steps after each prompt")
    ap.add_argument("--repeats", type=int, default=1, help="alternated rounds per (length, threads)")
    ap.add_argument("--llama-bench", default=DEFAULT_LLAMA_BENCH, help="llama-bench binary (used when it exists)")
    ap.add_argument("--venv", default=os.path.join(CACHE, "bench-venv"), help="llama-cpp-python venv otherwise")
    ap.add_argument("--work-dir", default=os.path.join(CACHE, "bench"), help="where the models are made")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        kind, path = a.worker
        with open(path) as f:
            spec = json.load(f)
        print(RESULT_TAG + json.dumps(WORKERS[kind](spec)), flush=True)
        return 0
    try:
        lengths = [int(x) for x in a.lengths.split(",")]
        threads = [int(x) for x in a.threads.split(",")]
    except ValueError:
        ap.error("--lengths and --threads take comma-separated integers")
    if not lengths or min(lengths) < 1 or not threads or min(threads) < 1 or a.gen_tokens < 1 or a.repeats < 1:
        ap.error("--lengths, --threads, --gen-tokens and --repeats must be positive")

    from intdet.bench import bench_prompt_ids
    from intdet.model import load_model

    bc = bench_cpu()
    os.makedirs(a.work_dir, exist_ok=True)
    use_bench = os.path.isfile(a.llama_bench) and os.access(a.llama_bench, os.X_OK)
    py = bc.ensure_venv(a.venv, "llama-cpp-python", False)  # also quantizes the Q8_0 file
    m = bc.prepare_smollm2(py, a.work_dir)
    lm = load_model(m["intdet"])
    ctx = int(lm.cfg["context_length"])
    import intdet.rss

    rss_py = intdet.rss.__file__
    peer = f"llama-bench {a.llama_bench} (-fa 1)" if use_bench else "llama-cpp-python (flash_attn=True)"
    log(f"peer: {peer}")
    rows = []
    for n in lengths:
        n_eff = min(n, ctx - a.gen_tokens)
        ids = bench_prompt_ids(lm, n_eff)
        for T in threads:
            res = {"intdet": [], "llama": []}
            for r in range(a.repeats):
                spec = {"ids": ids, "gen": a.gen_tokens, "threads": T, "rss_py": rss_py}
                log(f"N={n_eff} T={T} round {r + 1}: intdet")
                res["intdet"].append(run_worker(sys.executable, "intdet", dict(spec, model=m["intdet"])))
                log(f"N={n_eff} T={T} round {r + 1}: llama.cpp")
                if use_bench:
                    res["llama"].append(run_llama_bench(a.llama_bench, m["llama"], n_eff, a.gen_tokens, T))
                else:
                    res["llama"].append(run_worker(py, "llama", dict(spec, model=m["llama"])))

            def med(k, key):
                v = [x[key] for x in res[k] if x[key] is not None]
                return statistics.median(v) if v else None

            row = {"prompt_tokens": n_eff, "threads": T}
            for k in res:
                for key in ("pp", "tg", "rss"):
                    row[f"{k}_{key}"] = med(k, key)
            rows.append(row)
            log(f"  {row}")
    print(f"SmolLM2-135M-Instruct, gen {a.gen_tokens} tokens after each prompt, {a.repeats} round(s), peer {peer}")
    print("| prompt | threads | intdet pp | llama.cpp pp | pp ratio | intdet tg | llama.cpp tg | tg ratio "
          "| intdet RSS MiB | llama.cpp RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mib = lambda x: f"{x / 2**20:.0f}" if x else "-"  # noqa: E731
        print(f"| {r['prompt_tokens']} | {r['threads']} | {r['intdet_pp']:.1f} | {r['llama_pp']:.1f} | "
              f"{fmt_ratio(r['intdet_pp'], r['llama_pp'])} | {r['intdet_tg']:.1f} | {r['llama_tg']:.1f} | "
              f"{fmt_ratio(r['intdet_tg'], r['llama_tg'])} | {mib(r['intdet_rss'])} | {mib(r['llama_rss'])} |")
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"peer": peer, "rows": rows}, f, indent=1)
        os.replace(tmp, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
