#!/usr/bin/env python3
"""intdet serve against llama-cpp-python's server, same model, same prompts, one run.

    python scripts/bench_serve.py [--clients 1 --clients 4 ...] [--requests 2] [--max-tokens 64]
                                  [--threads 2] [--intdet-only] [--json OUT]

For each concurrency C (default 1, 4, 8, 16), each engine in turn (a fresh
server process per engine and level, so neither runs while the other is
measured):

1. throughput: C client threads send C x ``--requests`` streaming greedy
   completions (temperature 0, ``max_tokens``), every request a different
   prompt, each client taking the next request from one shared list when its
   previous one ends (so C stay in flight until the list runs out, as
   vLLM's ``benchmark_serving.py --max-concurrency`` sends them; a fixed
   share per client would leave the last clients running alone while the
   others are done, since greedy completions stop at different lengths); measured: requests/s and output tok/s over the wall time of the
   level, time to first token (TTFT: request sent -> first text chunk) and
   inter-token latency (ITL: gaps between text chunks of one response),
   p50 and p99;
2. determinism: C identical greedy requests at once (the same prompt),
   counting distinct completions.

Servers: ``python -m intdet serve -m MODEL --max-batch 16 --threads T`` and
``python -m llama_cpp.server --model MODEL --n_threads T --n_threads_batch T
--interrupt_requests False`` (its default interrupts a running stream when
another request arrives) from the venv of scripts/bench_cpu.py
(``$INTDET_CACHE/bench-venv``; its ``llama_cpp.server`` needs the
``llama-cpp-python[server]`` extra). Model: SmolLM2-135M-Instruct as Q8_0,
requantized by llama.cpp's own quantizer from the shipped Q4_1 GGUF (the
file bench_cpu.py writes under ``$INTDET_CACHE/bench``); intdet serves its
int8 conversion of that same Q8_0 file. ``--intdet-only`` measures intdet
alone (on the Q8_0 file if present, else the Q4_1 GGUF).

Output tokens are counted the same way for both servers: one per streamed
text chunk (both send one chunk per token; a token that ends inside a UTF-8
character sends none). Prints a table
and the ratios intdet / llama.cpp and intdet at C / intdet at 1. Timings on
a shared machine vary; tests never read them.
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
PROMPTS = [
    "The history of the printing press begins", "A recipe for a simple tomato soup:", "Explain how a bicycle works.",
    "The three most important rules of chess are", "Once upon a time in a small village", "def quicksort(xs):",
    "The capital of France is", "Photosynthesis is the process by which", "Write a short poem about the sea.",
    "The main causes of the French Revolution were", "In mathematics, a prime number is", "How do vaccines work?",
    "The best way to learn a new language is", "import numpy as np\n# compute the mean of a matrix",
    "A haiku about autumn:", "The difference between weather and climate is",
]
IDENTICAL = "Tell me about the moon."


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bench_cpu():
    spec = importlib.util.spec_from_file_location("bench_cpu", os.path.join(HERE, "bench_cpu.py"))
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


def stream_completion(port: int, prompt: str, max_tokens: int, usage: bool = True) -> dict:
    """One streaming greedy completion; returns text, tokens, ttft and the chunk times.
    ``usage``: ask for the usage chunk (llama-cpp-python's server has no stream_options)."""
    req = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 0, "stream": True}
    if usage:
        req["stream_options"] = {"include_usage": True}
    body = json.dumps(req)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    times, text, usage = [], [], None
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
        if ev.get("usage"):
            usage = ev["usage"].get("completion_tokens")
        for ch in ev.get("choices") or []:
            if ch.get("text"):
                times.append(time.perf_counter())
                text.append(ch["text"])
    c.close()
    return {"text": "".join(text), "tokens": len(times), "usage_tokens": usage,
            "ttft": (times[0] - t0) if times else None, "gaps": [b - a for a, b in zip(times, times[1:])],
            "end": time.perf_counter()}


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def run_level(port: int, clients: int, requests: int, max_tokens: int, usage: bool = True) -> dict:
    results, errors = [], []
    lock = threading.Lock()

    todo = iter(range(clients * requests))  # shared: a client takes the next when its last one ends

    def client(k):
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            p = PROMPTS[i % len(PROMPTS)] + f" ({i})"
            try:
                r = stream_completion(port, p, max_tokens, usage)
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(str(e))
                return
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    ths = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    wall = time.perf_counter() - t0
    # determinism: C identical greedy requests at once
    same = [None] * clients

    def one(k):
        try:
            same[k] = stream_completion(port, IDENTICAL, max_tokens, usage)["text"]
        except Exception as e:  # noqa: BLE001
            same[k] = f"error: {e}"

    ths = [threading.Thread(target=one, args=(k,)) for k in range(clients)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    toks = sum(r["tokens"] for r in results)
    ttft = [r["ttft"] for r in results if r["ttft"] is not None]
    gaps = [g for r in results for g in r["gaps"]]
    return {"clients": clients, "requests": len(results), "errors": errors[:3], "wall_s": wall,
            "req_s": len(results) / wall, "out_tok_s": toks / wall, "out_tokens": toks,
            "ttft_p50_ms": 1e3 * pct(ttft, 50), "ttft_p99_ms": 1e3 * pct(ttft, 99),
            "itl_p50_ms": 1e3 * pct(gaps, 50), "itl_p99_ms": 1e3 * pct(gaps, 99),
            "distinct_identical": len(set(same)), "identical_requests": clients}


def start_intdet(model, threads, max_batch):
    port = free_port()
    return ServerProc([sys.executable, "-m", "intdet", "serve", "-m", model, "--port", str(port), "--threads",
                       str(threads), "--max-batch", str(max_batch), "--max-connections", "256"], port, "intdet")


def start_llama(py, model, threads, n_ctx):
    port = free_port()
    return ServerProc([py, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1", "--port", str(port),
                       "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(n_ctx),
                       "--interrupt_requests", "False"], port, "llama.cpp")


def format_table(rows) -> str:
    head = ("| engine | clients | requests/s | output tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | "
            "distinct outputs of identical greedy requests |\n|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['engine']} | {r['clients']} | {r['req_s']:.2f} | {r['out_tok_s']:.1f} | "
                     f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | {r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} | "
                     f"{r['distinct_identical']} of {r['identical_requests']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    from intdet.resolve import cache_dir, default_model_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, action="append", help="concurrent clients (repeatable; default 1 4 8 16)")
    ap.add_argument("--requests", type=int, default=2, help="requests per level: this many times the clients (default 2)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads of each server")
    ap.add_argument("--max-batch", type=int, default=16, help="intdet serve --max-batch")
    ap.add_argument("--venv", default=os.path.join(cache_dir(), "bench-venv"), help="venv with llama-cpp-python[server]")
    ap.add_argument("--work-dir", default=os.path.join(cache_dir(), "bench"), help="where the Q8_0 GGUF is kept")
    ap.add_argument("--intdet-only", action="store_true", help="measure intdet alone (no llama-cpp-python)")
    ap.add_argument("--json", dest="json_out", default=None, help="also write every figure to this JSON file")
    args = ap.parse_args(argv)
    levels = args.clients or [1, 4, 8, 16]
    if min(levels) < 1 or args.requests < 1 or args.max_tokens < 1:
        ap.error("--clients, --requests and --max-tokens must be >= 1")
    work = os.path.expanduser(args.work_dir)
    src = default_model_path()
    q8 = os.path.join(work, os.path.basename(src).replace("Q4_1", "Q8_0"))
    py = None
    if not args.intdet_only:
        bc = bench_cpu()
        py = bc.venv_python(os.path.expanduser(args.venv))
        chk = subprocess.run([py, "-c", "import llama_cpp, llama_cpp.server.app; print(llama_cpp.__version__)"],
                             capture_output=True, text=True) if os.path.exists(py) else None
        if chk is None or chk.returncode != 0:
            raise SystemExit(f"{args.venv}: no llama-cpp-python with its server extra; install it with\n"
                             f"  {py} -m pip install 'llama-cpp-python[server]'\n(or run with --intdet-only)")
        log(f"llama-cpp-python {chk.stdout.strip()} from {args.venv}")
        os.makedirs(work, exist_ok=True)
        bc.quantize_q8_0(py, src, q8)
    model = q8 if os.path.isfile(q8) else src
    log(f"model: {model}")
    # convert once, outside the timed part
    subprocess.run([sys.executable, "-m", "intdet", "generate", "-m", model, "-n", "1", "-q", "x"], check=True,
                   stdout=subprocess.DEVNULL)
    rows = []
    n_ctx = 2048
    for c in levels:
        engines = [("intdet", lambda: start_intdet(model, args.threads, args.max_batch))]
        if py:
            engines.append(("llama.cpp", lambda: start_llama(py, model, args.threads, n_ctx)))
        for name, start in engines:
            log(f"{name}: {c} clients x {args.requests} requests, max_tokens {args.max_tokens}")
            srv = start()
            try:
                usage = name == "intdet"
                stream_completion(srv.port, "warm up", 4, usage)
                r = run_level(srv.port, c, args.requests, args.max_tokens, usage)
            finally:
                srv.stop()
            r["engine"] = name
            rows.append(r)
            log(f"  {r['out_tok_s']:.1f} out tok/s, {r['req_s']:.2f} req/s, distinct {r['distinct_identical']} of {c}"
                + (f", errors: {r['errors']}" if r["errors"] else ""))
    print(format_table(rows))
    base = {r["engine"]: r for r in rows if r["clients"] == min(levels)}
    print()
    for c in levels:
        mine = next(r for r in rows if r["engine"] == "intdet" and r["clients"] == c)
        line = f"{c} clients: intdet output tok/s = {mine['out_tok_s'] / base['intdet']['out_tok_s']:.2f}x its own " \
               f"at {min(levels)} client(s)"
        peer = next((r for r in rows if r["engine"] == "llama.cpp" and r["clients"] == c), None)
        if peer:
            line += f", {mine['out_tok_s'] / peer['out_tok_s']:.2f}x llama-cpp-python's server"
        print(line)
    print(f"\nmodel {os.path.basename(model)}, {args.threads} threads per server, loadavg at the end "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"rows": rows, "model": model, "threads": args.threads, "loadavg": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
