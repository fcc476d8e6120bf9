#!/usr/bin/env python3
"""Write a Hugging Face checkpoint dir with deterministic PRNG weights.

    python scripts/make_random_model.py OUT_DIR [--shape qwen3-0.6b|tiny-llama|tiny-qwen3] [--seed N]

The same as `intdet random-model` (kept for older instructions): the
generator is intdet.random_model, one definition shared with the tests, so
the same seed gives the same bytes on any machine. qwen3-0.6b has
Qwen3-0.6B's exact shape in bf16 (~1.2 GB) with the tiny 302-token test
tokenizer; see intdet/random_model.py.
"""

import argparse
import sys
import time

from intdet.errors import IntdetError
from intdet.random_model import SHAPES, write_random_model


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--shape", choices=SHAPES, default="qwen3-0.6b")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.time()

    def log(msg):
        print(f"{time.time() - t0:7.1f}s {msg}", flush=True)

    try:
        write_random_model(args.out_dir, args.shape, args.seed, log=log)
    except (IntdetError, OSError) as e:
        print(f"make_random_model.py: error: {e}", file=sys.stderr)
        return 1
    log(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
