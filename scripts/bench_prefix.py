#!/usr/bin/env python3
"""Exact prefix caching on a few-shot workload: the scheduler with and
without ``prefix_cache``, the same requests, outputs compared.

    python scripts/bench_prefix.py [-m MODEL] [--requests 32] [--max-batch 8] [--shots 5] [--threads N]

Workload: ``--requests`` prompts that share a few-shot header of ``--shots``
WikiText-2 question/answer pairs (about 1,500 tokens on the default model)
and end with their own question; 16 greedy tokens each; all submitted at
once, ``--max-batch`` running together (as an evaluation harness sends
them). Prints wall time and output tok/s of each mode, the ratio, TTFT p50
(first token after admission, so queueing is left out) of cache misses and hits, and whether every request's tokens and chain hash
are identical in both modes (exit 1 if not).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

WIKI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data",
                    "wikitext-2-raw-test.txt")


def prompts(tok_encode, shots: int, n: int, fresh_every: int = 0) -> list:
    """n few-shot prompts: one header of ``shots`` WikiText-2 question/answer
    pairs, then each prompt's own passage. ``fresh_every`` k > 0: every k-th
    prompt (k-1, 2k-1, ...) has a header of its own instead, a prefix-cache
    miss among the hits."""
    with open(WIKI, encoding="utf-8") as f:
        lines = [ln.strip() for ln in f if 200 < len(ln.strip()) < 900]

    def header(first: int) -> str:
        return "".join(f"Passage: {lines[i]}\nQuestion: What is this passage about?\nAnswer: {lines[i][:60]}\n\n"
                       for i in range(first, first + shots))

    out = []
    for i in range(n):
        own = fresh_every > 0 and i % fresh_every == fresh_every - 1
        h = header(shots + n + shots * i) if own else header(0)  # after the shared header and the passages
        out.append(tok_encode(h + f"Passage: {lines[shots + i]}\nQuestion: What is this passage about?\nAnswer:"))
    return out


def run(engine, ids_list, max_batch: int, cache: bool):
    from intdet.scheduler import Request, Scheduler

    sch = Scheduler(engine, max_batch=max_batch, kv_bytes=1 << 34, prefix_cache=cache)
    t0 = time.perf_counter()
    reqs = [sch.submit(Request(ids, 16)) for ids in ids_list]
    sch.run_until_idle()
    wall = time.perf_counter() - t0
    return sch, reqs, wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--shots", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    from intdet.api import LLM

    llm = LLM(a.model, threads=a.threads)
    ids_list = prompts(lambda t: llm.encode(t), a.shots, a.requests)
    lens = [len(x) for x in ids_list]
    _, cold, t_cold = run(llm.engine, ids_list, a.max_batch, False)
    sch, warm, t_warm = run(llm.engine, ids_list, a.max_batch, True)
    same = all((c.tokens, c.hash) == (w.tokens, w.hash) for c, w in zip(cold, warm))
    out = sum(len(r.tokens) for r in cold)
    miss = [r.t_first - r.t_start for r in warm if r.cached_tokens == 0]
    hit = [r.t_first - r.t_start for r in warm if r.cached_tokens > 0]
    hit_alone = [r.t_first - r.t_start for r in cold]
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"cpu: {cpu}; {a.requests} requests of {min(lens)}-{max(lens)} prompt tokens ({a.shots}-shot header), "
          f"16 greedy tokens each, max_batch {a.max_batch}")
    print("| mode | wall s | output tok/s | TTFT p50 s | cached prompt tokens |")
    print("|---|---|---|---|---|")
    print(f"| no prefix cache | {t_cold:.1f} | {out / t_cold:.1f} | {statistics.median(hit_alone):.2f} | 0 |")
    print(f"| prefix cache | {t_warm:.1f} | {out / t_warm:.1f} | misses {statistics.median(miss):.2f}, hits "
          f"{statistics.median(hit) if hit else float('nan'):.2f} | {sum(r.cached_tokens for r in warm)} "
          f"of {sum(lens)} ({sch.cache.hits} hits) |")
    print(f"throughput with / without the cache: {t_cold / t_warm:.2f}x; tokens and hashes identical: "
          f"{'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
