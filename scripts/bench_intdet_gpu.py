#!/usr/bin/env python3
"""intdet's rows of the device check's side-by-side benchmark (issue 50):
decode tok/s at each batch size after a shared prompt, and prefill tok/s.

    python scripts/bench_intdet_gpu.py MODEL_DIR ROWS.jsonl --model NAME
        [--device cuda|webgpu|cpu] [--batches 1,8,64,256] [--prompt 512]
        [--steps 64] [--prefill 2048] [--no-graphs]

MODEL_DIR is a converted intdet model. Decode: one sequence is prefilled with
PROMPT random tokens and its cache copied to the other rows (State.copy_prefix,
as llama-batched-bench -pps copies its shared prompt); then 3 warm-up steps
and STEPS timed steps of Engine.forward_batch, one random token per row per
step (llama-batched-bench also feeds random tokens: the token choice is not
timed in either), the int32 logits of every row landing in one reused host
buffer (intdet's product; llama.cpp also copies every row's logits to the
host). CUDA graphs on unless --no-graphs. Prefill: PREFILL random tokens
into a fresh state, best of 3 after a warm-up. --device cpu runs the same
code for rehearsals (rows with backend "cpu")."""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def bench_decode(eng, batch: int, prompt: int, steps: int, rng, warm: int = 3) -> float:
    V = eng.vocab_size
    first = eng.new_state(prompt + warm + steps + 1)
    first.forward(rng.integers(0, V, prompt))
    seqs = [first]
    for _ in range(batch - 1):
        s = eng.new_state(prompt + warm + steps + 1)
        s.copy_prefix(first, prompt)
        seqs.append(s)
    out = np.empty((batch, V), np.int32)
    feed = rng.integers(0, V, (warm + steps, batch, 1))
    for i in range(warm):
        eng.forward_batch(seqs, list(feed[i]), out=out)
    t = time.perf_counter()
    for i in range(warm, warm + steps):
        eng.forward_batch(seqs, list(feed[i]), out=out)  # returns after the logits are on the host
    return batch * steps / (time.perf_counter() - t)


def bench_prefill(eng, n: int, rng, repeats: int = 3) -> float:
    ids = rng.integers(0, eng.vocab_size, n)
    best = 0.0
    for _ in range(repeats + 1):  # the first is a warm-up
        s = eng.new_state(n)
        t = time.perf_counter()
        s.forward(ids)
        best = max(best, n / (time.perf_counter() - t))
        del s
    return best


def main(argv=None) -> int:
    sys.path.insert(0, HERE)
    import bench_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("rows", help="JSONL file the rows are appended to")
    ap.add_argument("--model", required=True, help="the rows' model name (qwen3-0.6b, llama3-8b)")
    ap.add_argument("--device", choices=bench_results.BACKENDS, default="cuda")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--prefill-ab", action="store_true",
                    help="cuda: also time the prefill on the earlier paths (the tiled IMMA GEMM, unfused, and the "
                         "16-row tensor-core attention) and print the ratio (same bits; not a results row)")
    a = ap.parse_args(argv)
    from intdet.errors import IntdetError
    from intdet.model import Engine, load_model

    try:
        t = time.perf_counter()
        kw = {"cuda_graphs": not a.no_graphs} if a.device == "cuda" else {}
        eng = Engine(load_model(a.model_dir), a.device, **kw)
        print(f"intdet {a.model} on {eng.device_name}: loaded in {time.perf_counter() - t:.1f} s", flush=True)
    except IntdetError as e:
        print(f"bench_intdet_gpu: error: {e}", file=sys.stderr)
        return 1
    rng = np.random.default_rng(0)
    for b in [int(x) for x in a.batches.split(",") if x]:
        rate = bench_decode(eng, b, a.prompt, a.steps, rng)
        print(f"intdet {a.device} {a.model} decode batch {b} after {a.prompt}: {rate:.1f} tok/s", flush=True)
        bench_results.append_row(a.rows, bench_results.make_row("intdet", a.model, "decode", b, a.prompt, rate,
                                                                a.device))
    if a.prefill:
        rate = bench_prefill(eng, a.prefill, rng)
        print(f"intdet {a.device} {a.model} prefill {a.prefill}: {rate:.1f} tok/s", flush=True)
        bench_results.append_row(a.rows, bench_results.make_row("intdet", a.model, "prefill", 1, a.prefill, rate,
                                                                a.device))
        if a.prefill_ab and a.device == "cuda":
            ops = eng.backend.ops
            try:
                ops.set_prefill_gemm(2)
                ops.set_attn_path(2)
                old = bench_prefill(eng, a.prefill, rng)
            finally:
                ops.set_prefill_gemm(0)
                ops.set_attn_path(0)
            print(f"intdet {a.device} {a.model} prefill {a.prefill} on the earlier paths (tiled GEMM, 16-row "
                  f"attention): {old:.1f} tok/s; now / earlier = {rate / old:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
