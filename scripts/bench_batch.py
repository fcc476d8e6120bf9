#!/usr/bin/env python3
"""intdet batch throughput, the engines side by side in one run: the serial
loop (intdet.LLM.generate one item at a time), then the same job through
run_job on the local engine in this process (workers 0), with 1 and 2 worker
processes, on Ray Data (local mode) and on a Dask LocalCluster (2 workers
each), with items/s, generated tok/s and the ratio to the serial loop. Every
engine's output is checked byte for byte against the local engine's (after
ordering by id); a mismatch is an error. This machine is noisy: compare the
ratios, not the absolute figures.

    python scripts/bench_batch.py [-m MODEL] [--items 64] [--max-tokens 32] [--batch-size 8]
                                  [--engines serial,local0,local1,local2,ray,dask] [--workers 2]

The default model is SmolLM2-135M-Instruct (as every intdet command). Times
include each engine's start (processes, Ray, Dask, model loads): that is the
overhead a job pays; --items sets how far it is amortized.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ENGINES = ("serial", "local0", "local1", "local2", "ray", "dask")


def make_items(n: int, max_tokens: int) -> list:
    topics = ["the sea", "a small town", "rivers", "the moon", "a library", "winter", "trains", "bread"]
    return [{"id": f"i{i}", "prompt": f"Write a sentence about {topics[i % len(topics)]} number {i}.",
             "max_tokens": max_tokens, "temperature": 0 if i % 2 == 0 else 0.7, "seed": i} for i in range(n)]


def run_serial(model: str, items: list, threads: int) -> tuple:
    import intdet

    t0 = time.perf_counter()
    llm = intdet.load(model, threads=threads or None)
    toks = 0
    for it in items:
        c = llm.generate(it["prompt"], intdet.SamplingParams(max_tokens=it["max_tokens"],
                                                             temperature=it["temperature"], seed=it["seed"]))
        toks += len(c.tokens)
    return time.perf_counter() - t0, toks, None


def run_engine(name: str, model: str, in_path: str, out_dir: str, batch_size: int, workers: int) -> tuple:
    from intdet.batch import run_job

    out = os.path.join(out_dir, f"{name}.jsonl")
    if name.startswith("local"):
        w = int(name[5:])
        kw = dict(engine="local", workers=w, threads=None)
    else:
        kw = dict(engine=name, workers=workers, threads=1)
    t0 = time.perf_counter()
    s = run_job(in_path, out, model=model, batch_size=batch_size, **kw)
    dt = time.perf_counter() - t0
    if s["errors"]:
        sys.exit(f"bench_batch: {name}: {s['errors']} items failed")
    with open(out, "rb") as f:
        lines = sorted(f.read().splitlines())
    return dt, s["generate"]["tokens"], lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="model (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--items", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2, help="Ray actors / Dask workers")
    ap.add_argument("--threads", type=int, default=0, help="threads of the serial loop (0: all cores)")
    ap.add_argument("--engines", default=",".join(ENGINES))
    a = ap.parse_args(argv)
    engines = [e for e in a.engines.split(",") if e]
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        sys.exit(f"bench_batch: --engines: {bad[0]!r} is not one of {', '.join(ENGINES)}")
    from intdet.resolve import resolve_model

    model = resolve_model(a.model, progress=sys.stderr.isatty())
    items = make_items(a.items, a.max_tokens)
    rows, ref = [], None
    with tempfile.TemporaryDirectory(prefix="bench_batch_") as d:
        in_path = os.path.join(d, "items.jsonl")
        with open(in_path, "w") as f:
            f.write("".join(json.dumps(it) + "\n" for it in items))
        for e in engines:
            print(f"  {e} ...", file=sys.stderr)
            if e == "serial":
                dt, toks, lines = run_serial(model, items, a.threads)
            else:
                dt, toks, lines = run_engine(e, model, in_path, d, a.batch_size, a.workers)
                if ref is None:
                    ref = (e, lines)
                elif lines != ref[1]:
                    sys.exit(f"bench_batch: {e}'s output differs from {ref[0]}'s")
            if rows and toks != rows[0][2]:
                sys.exit(f"bench_batch: {e} generated {toks} tokens, {rows[0][0]} {rows[0][2]}")
            rows.append((e, dt, toks))
    base = rows[0][1] if rows[0][0] == "serial" else None
    print(f"{a.items} items, max_tokens {a.max_tokens}, batch size {a.batch_size}, model {os.path.basename(model)}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'engine':<8} {'seconds':>8} {'items/s':>8} {'tok/s':>8} {'vs serial':>10}")
    for e, dt, toks in rows:
        ratio = f"{base / dt:.2f}x" if base else "-"
        print(f"{e:<8} {dt:8.2f} {a.items / dt:8.2f} {toks / dt:8.1f} {ratio:>10}")
    if ref:
        print(f"outputs of {', '.join(e for e, _, _ in rows if e != 'serial')}: byte-identical after ordering by id")


if __name__ == "__main__":
    main()
