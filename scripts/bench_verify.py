"""Receipts made on one kernel set and thread count, verified on another
(issue 51's target): N generate items through `intdet batch --receipts`,
then `intdet verify` of the whole output under another INTDET_ISA and
--threads, then one record with an output id changed, which verify must
name at its step. Prints one JSON line with the counts and timings; exit 1
when anything does not match what it should.

    python scripts/bench_verify.py                     # 1,000 receipts, default model (SmolLM2-135M)
    python scripts/bench_verify.py -n 50 -m DIR --gen-isa avx2 --verify-isa scalar
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

WORDS = ("the cat sat on a mat and then ran off to see what the dog had found under an old red chair "
         "while rain fell").split()
SAMPLERS = ({}, {"temperature": "0.8"}, {"temperature": "1.1", "top_k": 40}, {"temperature": "0.7", "top_p": "0.9"},
            {"temperature": "1", "min_p": "0.05"}, {"temperature": "0.9", "repeat_penalty": "1.2"})


def items(n: int, max_tokens: int) -> list:
    """n generate items: short text prompts, every sampler kind, their own seeds."""
    out = []
    for i in range(n):
        prompt = " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(2 + i % 4))
        out.append(dict({"id": f"r{i}", "prompt": prompt, "max_tokens": max_tokens, "seed": i}, **SAMPLERS[i % 6]))
    return out


def cli(args: list, isa: str | None) -> tuple:
    env = dict(os.environ)
    if isa:
        env["INTDET_ISA"] = isa
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "intdet", *args], capture_output=True, text=True, env=env)
    return r, time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=1000, help="receipts to make and verify")
    ap.add_argument("-m", "--model", default=None, help="model (default: intdet's, SmolLM2-135M-Instruct)")
    ap.add_argument("--max-tokens", type=int, default=4, help="output tokens per item")
    ap.add_argument("--gen-isa", default="avx2")
    ap.add_argument("--gen-threads", type=int, default=2)
    ap.add_argument("--verify-isa", default="scalar")
    ap.add_argument("--verify-threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=250, help="sequences run together (batch and verify)")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    a = ap.parse_args(argv)
    work = a.dir or tempfile.mkdtemp(prefix="bench_verify_")
    os.makedirs(work, exist_ok=True)
    src, out = os.path.join(work, "items.jsonl"), os.path.join(work, "out.jsonl")
    with open(src, "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in items(a.n, a.max_tokens))
    if os.path.exists(out):
        os.unlink(out)
    model = ["-m", a.model] if a.model else []
    r, t_gen = cli(["batch", src, "-o", out, *model, "--receipts", "--workers", "0", "--batch-size", str(a.batch),
                    "--threads", str(a.gen_threads), "--no-progress"], a.gen_isa)
    if r.returncode:
        print(r.stderr, file=sys.stderr)
        return 1
    recs = [json.loads(x) for x in open(out)]
    n_tokens = sum(len(x["result"]["tokens"]) for x in recs if x["result"])
    r, t_ver = cli(["verify", out, *model, "-q", "--threads", str(a.verify_threads), "--max-batch", str(a.batch)],
                   a.verify_isa)
    matched = r.returncode == 0 and f"{a.n} match, 0 mismatch" in r.stderr
    # one output id changed: verify must name that record and step
    k = next(i for i, x in enumerate(recs) if len(x["result"]["tokens"]) >= 2)
    step = len(recs[k]["result"]["receipt"]["output_ids"])
    recs[k]["result"]["receipt"]["output_ids"][step - 1] ^= 1
    bad = os.path.join(work, "tampered.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps(recs[k]) + "\n")
    rb, _ = cli(["verify", bad, *model, "-q", "--threads", str(a.verify_threads)], a.verify_isa)
    named = rb.returncode == 1 and f"MISMATCH at step {step}:" in rb.stdout
    print(json.dumps({"receipts": a.n, "generated_tokens": n_tokens, "gen": f"{a.gen_isa}, {a.gen_threads} threads",
                      "gen_s": round(t_gen, 1), "verify": f"{a.verify_isa}, {a.verify_threads} threads",
                      "verify_s": round(t_ver, 1), "all_match": matched, "verify_summary": r.stderr.strip()[-200:],
                      "tampered_named": named, "tampered_line": rb.stdout.strip()[:200], "dir": work}))
    return 0 if matched and named else 1


if __name__ == "__main__":
    sys.exit(main())
