#!/usr/bin/env python3
"""The pinned greedy hash inside every batch size the device benchmark runs
(issue 50): `intdet hash-check --device cuda` covers batches of 4 and 8; the
benchmark decodes 64 and 256 rows at once, so the same generation (hash-
check's prompt and steps, greedy) runs here inside batches of each size with
random co-prompts of other lengths (hashcheck.run_one), on one backend, and
every hash must equal --expect (the CPU's).

    python scripts/hash_batches.py MODEL_DIR --device cuda|webgpu|cpu --expect HASH
        [--batches 1,8,64,256] [--steps 16] [--graphs]

Prints one line per batch size and exits 1 unless every hash matches."""

from __future__ import annotations

import argparse
import re
import sys
import time

PROMPT = "Shall I compare thee to a summer's day?"  # intdet hash-check's default --prompt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--expect", required=True, help="12-hex-digit greedy hash (the CPU's)")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0, help="co-prompt seed (batch B uses seed + B, as hash-check)")
    ap.add_argument("--graphs", action="store_true", help="cuda: replay decode steps from CUDA graphs")
    a = ap.parse_args(argv)
    if not re.fullmatch(r"[0-9a-f]{12}", a.expect):
        ap.error(f"--expect: {a.expect!r} is not a 12-hex-digit hash")
    from intdet.errors import IntdetError
    from intdet.hashcheck import run_one
    from intdet.model import Engine, load_model
    from intdet.sampling import Sampler
    from intdet.tokenizer.text import encode

    try:
        lm = load_model(a.model_dir)
        eng = Engine(lm, a.device, **({"cuda_graphs": a.graphs} if a.device == "cuda" else {}))
    except IntdetError as e:
        print(f"hash_batches: error: {e}", file=sys.stderr)
        return 1
    ids = encode(lm.tokenizer, lm.tok_meta, PROMPT)
    ok = True
    for b in [int(x) for x in a.batches.split(",") if x]:
        t = time.perf_counter()
        r = run_one(eng, ids, a.steps, Sampler(), batch=b, co_seed=a.seed + b)
        same = r.hash == a.expect
        ok &= same
        print(f"{a.device}{' + CUDA graphs' if a.graphs else ''}, inside a batch of {b:3d}: {r.hash} "
              f"{'matches' if same else 'DIFFERS from ' + a.expect} ({time.perf_counter() - t:.1f} s)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
