#!/usr/bin/env python3
"""Decode and prefill speed under OpenMP wait policies, idle and under a
competing CPU load, side by side in one run (this machine is noisy: compare
the ratios, not the absolute figures).

    python scripts/bench_threads.py [-m MODEL] [--threads 1 --threads 2] [--busy 0 --busy 1 --busy 2]
                                    [--policy NAME=ENV ...] [--gen-tokens 64] [--prompt-tokens 128]

--threads 0 is intdet's default, auto: every core this process may use, fewer
while other processes keep some busy (csrc/cpu/threads.cpp); the "used" column
is the count its last decode step took. Each (policy, busy, threads) cell runs `python -m intdet bench --json` in a
fresh process with the policy's environment (libgomp reads it at start-up),
while `busy` processes spin on their own (`while True: pass`), each started
before and killed after the cell. Default policies:
- default: OMP_WAIT_POLICY and GOMP_SPINCOUNT unset (libgomp spins, then sleeps);
- passive: OMP_WAIT_POLICY=passive (workers sleep at once).
--policy gs1k=GOMP_SPINCOUNT=1000 adds a bounded spin, for example. The last
column is decode tok/s over the first policy's in the same (busy, threads) cell.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

DEFAULT_POLICIES = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "passive"},
}


def _bench(model, threads, gen, prompt, env):
    cmd = [sys.executable, "-m", "intdet", "bench", "--threads", str(threads), "--gen-tokens", str(gen),
           "--prompt-tokens", str(prompt), "--json"] + (["-m", model] if model else [])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode:
        sys.exit(f"bench_threads: {' '.join(cmd)} failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout)["rows"][0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", type=int, action="append")
    ap.add_argument("--busy", type=int, action="append", help="competing spinning processes (repeat)")
    ap.add_argument("--policy", action="append", default=[], help="NAME=VAR=VALUE[,VAR=VALUE]: an extra policy")
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    a = ap.parse_args(argv)
    policies = dict(DEFAULT_POLICIES)
    for p in a.policy:
        name, _, spec = p.partition("=")
        policies[name] = dict(kv.split("=", 1) for kv in spec.split(",") if kv)
    threads = a.threads or [0, 1, os.cpu_count() or 1]
    busies = a.busy or [0, 1]
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    _bench(a.model, 1, 4, 8, base)  # converts into the cache once, outside the timings
    first = next(iter(policies))
    print(f"{'policy':<10} {'busy':>4} {'threads':>7} {'used':>4} {'prefill tok/s':>13} {'decode tok/s':>12}  "
          f"decode / {first}")
    res = {}
    for busy in busies:
        for t in threads:
            for name, env in policies.items():
                hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
                try:
                    time.sleep(0.3)
                    row = _bench(a.model, t, a.gen_tokens, a.prompt_tokens, {**base, **env})
                finally:
                    for h in hogs:
                        h.kill()
                        h.wait()
                res[(name, busy, t)] = row
                ref = res.get((first, busy, t), row)["decode_tok_s"]
                shown = row["threads"] if row["threads_requested"] else "auto"
                print(f"{name:<10} {busy:>4} {shown:>7} {row['threads_used']:>4} {row['prefill_tok_s']:>13.1f} "
                      f"{row['decode_tok_s']:>12.1f}  {row['decode_tok_s'] / ref:.2f}", flush=True)


if __name__ == "__main__":
    main()
