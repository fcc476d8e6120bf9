#!/usr/bin/env python3
"""intdet serve against llama.cpp's own llama-server: same model file, same
requests, one run, three workloads.

    python scripts/bench_serve.py [--clients 1 --clients 8 ...] [--workload plain --workload fewshot ...]
                                  [--requests 2] [--threads N] [--json OUT]

Servers (a fresh process per engine, workload and concurrency C, so neither
runs while the other is measured):
  - llama-server built from the llama.cpp vendored in the llama-cpp-python
    sdist (scripts/build_llama_bench.sh, AVX-512 as the CPU has it, AMX off),
    run as its users run it for C clients: ``-np C`` slots of 2,048 tokens
    each, ``-fa on``, ``-t T -tb T``, every request with ``cache_prompt: true``
    (its per-slot prompt cache);
    (its host-memory prompt cache, ``--cache-ram``, on by default), and on the
    repetitive workload also with ``--spec-type ngram-simple`` (its n-gram
    speculation);
  - ``intdet serve --max-batch 16 --threads T`` (its prefix cache on, the
    default), plus ``--spec-ngram 4`` on the repetitive workload; on the
    few-shot one, the row "intdet" runs with ``--no-prefix-cache`` (the
    cache's baseline) beside "intdet --prefix-cache".
Model: SmolLM2-135M-Instruct as Q8_0, requantized by llama.cpp's own
llama-quantize from the shipped Q4_1 GGUF; intdet serves its int8 conversion
of that same file.

Workloads (greedy; C clients take the next request from one shared list as
their last one ends, as vLLM's ``benchmark_serving.py --max-concurrency``):
  - plain: ``--requests`` x C short distinct completion prompts, 64 tokens;
  - fewshot: ``--fewshot-requests`` prompts sharing a 5-shot WikiText-2 header
    (about 1,500 tokens; scripts/bench_prefix.py's), each with its own last
    passage, 16 tokens (an evaluation harness's shape); every
    ``--fewshot-fresh-every``-th prompt (default 8) has a header of its own:
    a miss under load, so the hits' TTFT is compared with misses' in the
    same run, not only with the first request on an idle server;
  - repeat: ``--requests`` x C chat requests "repeat this paragraph exactly"
    (distinct WikiText-2 paragraphs), 128 tokens (the output copies the
    prompt: what prompt-lookup speculation accepts).
Measured per run: output tok/s over the wall time, requests/s, time to first
token (request sent -> first text chunk; p50, and for a prefix cache p50 of
hits and of misses: cached_tokens in intdet's usage, timings.cache_n in
llama-server's last chunk), inter-token latency p50, and C identical greedy
requests sent at once (plain workload): the number of distinct outputs.
Prints a table per workload and the ratios; tests never read these timings.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WIKI = os.path.join(HERE, "..", "..", "shared", "data", "wikitext-2-raw-test.txt")
PROMPTS = [
    "The history of the printing press begins", "A recipe for a simple tomato soup:", "Explain how a bicycle works.",
    "The three most important rules of chess are", "Once upon a time in a small village", "def quicksort(xs):",
    "The capital of France is", "Photosynthesis is the process by which", "Write a short poem about the sea.",
    "The main causes of the French Revolution were", "In mathematics, a prime number is", "How do vaccines work?",
    "The best way to learn a new language is", "import numpy as np\n# compute the mean of a matrix",
    "A haiku about autumn:", "The difference between weather and climate is",
]
IDENTICAL = "Tell me about the moon."
WORKLOADS = ("plain", "fewshot", "repeat")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProc:
    """A server subprocess on a loopback port, ready when GET /v1/models answers."""

    def __init__(self, args, port, name, timeout=600):
        self.name, self.port = name, port
        self.log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"bench_serve_{name}.log"), "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{name} server exited with {self.proc.returncode}; log {self.log.name}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/v1/models")
                ok = c.getresponse().status == 200
                c.close()
                if ok:
                    return
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        raise SystemExit(f"{name} server did not start in {timeout} s; log {self.log.name}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def stream(port: int, job: dict) -> dict:
    """One streaming greedy request (job: prompt or messages, max_tokens,
    and any server-specific fields); returns text, chunk count, TTFT, gaps
    and the prompt tokens the server took from its cache."""
    chat = "messages" in job
    req = dict(job, temperature=0, seed=0, stream=True, stream_options={"include_usage": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions" if chat else "/v1/completions", body=json.dumps(req),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    times, text, cached, n_usage = [], [], None, None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        u = ev.get("usage") or {}
        n_usage = u.get("completion_tokens", n_usage)
        if "prompt_tokens_details" in u:  # intdet (and OpenAI): cached prompt tokens
            cached = (u["prompt_tokens_details"] or {}).get("cached_tokens", cached)
        if isinstance(ev.get("timings"), dict) and "cache_n" in ev["timings"]:  # llama-server
            cached = ev["timings"]["cache_n"]
        for ch in ev.get("choices") or []:
            piece = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
            if piece:
                times.append(time.perf_counter())
                text.append(piece)
    c.close()
    # tokens: the usage block's count (a server may send several tokens in one chunk), else one per chunk
    return {"text": "".join(text), "tokens": n_usage if n_usage is not None else len(times), "cached": cached,
            "ttft": (times[0] - t0) if times else None, "gaps": [b - a for a, b in zip(times, times[1:])]}


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def run_jobs(port: int, clients: int, jobs: list, fields: dict) -> tuple:
    results, errors = [], []
    lock = threading.Lock()
    todo = iter(jobs)

    def client():
        while True:
            with lock:
                job = next(todo, None)
            if job is None:
                return
            try:
                r = stream(port, dict(job, **fields))
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(str(e))
                return
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    ths = [threading.Thread(target=client) for _ in range(clients)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return results, errors, time.perf_counter() - t0


def measure(port: int, clients: int, jobs: list, identical: bool, fields: dict) -> dict:
    results, errors, wall = run_jobs(port, clients, jobs, fields)
    toks = sum(r["tokens"] for r in results)
    ttft = [r["ttft"] for r in results if r["ttft"] is not None]
    hit = [r["ttft"] for r in results if r["ttft"] is not None and (r["cached"] or 0) > 0]
    miss = [r["ttft"] for r in results if r["ttft"] is not None and not (r["cached"] or 0) > 0]
    row = {"clients": clients, "requests": len(results), "errors": errors[:3], "wall_s": wall,
           "req_s": len(results) / wall, "out_tok_s": toks / wall, "out_tokens": toks,
           "ttft_p50_ms": 1e3 * pct(ttft, 50), "ttft_hit_p50_ms": 1e3 * pct(hit, 50) if hit else None,
           "ttft_miss_p50_ms": 1e3 * pct(miss, 50) if miss else None, "hits": len(hit),
           "itl_p50_ms": 1e3 * pct([g for r in results for g in r["gaps"]], 50), "distinct_identical": None}
    if identical:  # C identical greedy requests at once
        same, _, _ = run_jobs(port, clients, [{"prompt": IDENTICAL, "max_tokens": 64}] * clients, fields)
        row["distinct_identical"] = len({r["text"] for r in same})
    return row


def wiki_paragraphs(lo: int, hi: int) -> list:
    with open(WIKI, encoding="utf-8") as f:
        return [ln.strip() for ln in f if lo < len(ln.strip()) < hi]


def workload(name: str, clients: int, requests: int, fewshot_requests: int, fresh_every: int = 8) -> list:
    if name == "plain":
        return [{"prompt": PROMPTS[i % len(PROMPTS)] + f" ({i})", "max_tokens": 64} for i in range(clients * requests)]
    if name == "fewshot":
        prompts = load_script("bench_prefix").prompts(lambda t: t, 5, fewshot_requests, fresh_every)  # text, not ids
        return [{"prompt": p, "max_tokens": 16} for p in prompts]
    paras = wiki_paragraphs(300, 700)
    return [{"messages": [{"role": "user", "content": "Repeat the following text exactly, word for word:\n\n"
                           + paras[i]}], "max_tokens": 128} for i in range(clients * requests)]


def start_intdet(model, threads, extra=()):
    port = free_port()
    return ServerProc([sys.executable, "-m", "intdet", "serve", "-m", model, "--port", str(port), "--threads",
                       str(threads), "--max-batch", "16", "--max-connections", "256", *extra], port, "intdet")


def start_llama(binary, model, threads, clients, extra=()):
    port = free_port()
    return ServerProc([binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                       "-tb", str(threads), "-np", str(clients), "-c", str(2048 * clients), "-fa", "on", *extra],
                      port, "llama-server")


def fmt(x, spec=".0f"):
    return "-" if x is None or x != x else format(x, spec)


def main(argv=None) -> int:
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    from intdet.resolve import cache_dir, default_model_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, action="append", help="concurrent clients (repeatable; default 1 8)")
    ap.add_argument("--workload", action="append", choices=WORKLOADS, help="repeatable; default all three")
    ap.add_argument("--requests", type=int, default=2, help="plain and repeat: this many times the clients")
    ap.add_argument("--fewshot-requests", type=int, default=32)
    ap.add_argument("--fewshot-fresh-every", type=int, default=8,
                    help="every k-th few-shot prompt has its own header (a miss under load; 0: none)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads of each server")
    ap.add_argument("--llama-dir", default=os.path.join(cache_dir(), "llama-bench"),
                    help="where scripts/build_llama_bench.sh puts bin/llama-server")
    ap.add_argument("--json", dest="json_out", default=None, help="also write every figure to this JSON file")
    args = ap.parse_args(argv)
    levels = args.clients or [1, 8]
    names = args.workload or list(WORKLOADS)
    if min(levels) < 1 or args.requests < 1 or args.fewshot_requests < 1 or args.fewshot_fresh_every < 0:
        ap.error("--clients, --requests and --fewshot-requests must be >= 1, --fewshot-fresh-every >= 0")
    subprocess.run(["bash", os.path.join(HERE, "build_llama_bench.sh"), args.llama_dir], check=True,
                   env=dict(os.environ, PYTHON=sys.executable))
    server = os.path.join(args.llama_dir, "bin", "llama-server")
    src = default_model_path()
    q8 = os.path.join(cache_dir(), "bench", os.path.basename(src).replace("Q4_1", "Q8_0"))
    os.makedirs(os.path.dirname(q8), exist_ok=True)
    load_script("bench_cpu").quantize_q8_0(None, src, q8, quantize_bin=os.path.join(args.llama_dir, "bin",
                                                                                   "llama-quantize"))
    subprocess.run([sys.executable, "-m", "intdet", "generate", "-m", q8, "-n", "1", "-q", "x"], check=True,
                   stdout=subprocess.DEVNULL)  # convert once, outside the timed part
    llama, ours = "llama", "intdet"
    engines = {"plain": [("llama-server", llama, ()), ("intdet", ours, ())],
               # "intdet": the cache's baseline, so without it (on by default since issue 52)
               "fewshot": [("llama-server", llama, ()), ("intdet", ours, ("--no-prefix-cache",)),
                           ("intdet --prefix-cache", ours, ("--prefix-cache",))],
               "repeat": [("llama-server", llama, ()), ("intdet", ours, ()),
                          ("llama-server --spec-type ngram-simple", llama, ("--spec-type", "ngram-simple")),
                          ("intdet --spec-ngram 4", ours, ("--spec-ngram", "4"))]}
    rows = []
    for w in names:
        for c in levels:
            jobs = workload(w, c, args.requests, args.fewshot_requests, args.fewshot_fresh_every)
            for name, kind, extra in engines[w]:
                log(f"{w}: {name}, {c} clients, {len(jobs)} requests")
                srv = (start_llama(server, q8, args.threads, c, extra) if kind == llama
                       else start_intdet(q8, args.threads, extra))
                try:
                    stream(srv.port, {"prompt": "warm up", "max_tokens": 4})
                    # llama-server's per-request prompt cache switch (on by default there; intdet
                    # refuses unknown fields, as OpenAI does, and caches unless --no-prefix-cache)
                    r = measure(srv.port, c, jobs, identical=(w == "plain"),
                                fields={"cache_prompt": True} if kind == llama else {})
                finally:
                    srv.stop()
                r.update(engine=name, workload=w)
                rows.append(r)
                log(f"  {r['out_tok_s']:.1f} out tok/s, TTFT p50 {r['ttft_p50_ms']:.0f} ms"
                    + (f", errors: {r['errors']}" if r["errors"] else ""))
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"cpu: {cpu}; {args.threads} threads per server; model {os.path.basename(q8)}")
    for w in names:
        print(f"\n{w}:\n| engine | clients | output tok/s | requests/s | TTFT p50 ms (hits / misses) | ITL p50 ms | "
              "distinct outputs of identical requests |\n|---|---|---|---|---|---|---|")
        for r in (r for r in rows if r["workload"] == w):
            hm = (f" ({fmt(r['ttft_hit_p50_ms'])} / {fmt(r['ttft_miss_p50_ms'])})" if r["hits"] else "")
            dist = "-" if r["distinct_identical"] is None else f"{r['distinct_identical']} of {r['clients']}"
            print(f"| {r['engine']} | {r['clients']} | {r['out_tok_s']:.1f} | {r['req_s']:.2f} | "
                  f"{fmt(r['ttft_p50_ms'])}{hm} | {fmt(r['itl_p50_ms'], '.1f')} | {dist} |")
    print()
    get = {(r["workload"], r["engine"], r["clients"]): r for r in rows}
    for w in names:
        for c in levels:
            base = get.get((w, "intdet", c))
            peer = get.get((w, "llama-server", c))
            parts = [f"intdet {base['out_tok_s'] / peer['out_tok_s']:.2f}x llama-server"] if base and peer else []
            for name, _, _ in engines[w][2:]:
                x = get.get((w, name, c))
                if x and base:
                    parts.append(f"{name} {x['out_tok_s'] / base['out_tok_s']:.2f}x intdet")
                    if peer:
                        parts.append(f"{x['out_tok_s'] / peer['out_tok_s']:.2f}x llama-server")
                    if x["ttft_hit_p50_ms"] and x["ttft_miss_p50_ms"]:
                        parts.append(f"TTFT hit/miss {x['ttft_hit_p50_ms'] / x['ttft_miss_p50_ms']:.2f}")
            print(f"{w}, {c} clients: " + "; ".join(parts))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"rows": rows, "model": q8, "threads": args.threads, "cpu": cpu}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
