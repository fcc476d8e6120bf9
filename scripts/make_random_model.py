#!/usr/bin/env python3
"""Write a Hugging Face checkpoint dir with deterministic PRNG weights.

    python scripts/make_random_model.py OUT_DIR [--shape qwen3-0.6b|tiny-llama|tiny-qwen3] [--seed N]

qwen3-0.6b has Qwen3-0.6B's exact shape (hidden 1024, intermediate 3072, 28
layers, 16 heads, 8 kv heads, head_dim 128, vocab 151936, tied embeddings,
q/k norm) stored in bf16 like the real checkpoint (~1.2 GB), with the tiny
302-token test tokenizer (vocab rows past it are never produced by it).
The generator is tests/models.py (one definition, shared with the tests):
same seed, same bytes, on any machine.
"""

import argparse
import importlib.util
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load_models():
    spec = importlib.util.spec_from_file_location("intdet_test_models", os.path.join(_HERE, "..", "tests", "models.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--shape", choices=["qwen3-0.6b", "tiny-llama", "tiny-qwen3"], default="qwen3-0.6b")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    m = _load_models()
    t0 = time.time()

    def log(msg):
        print(f"{time.time() - t0:7.1f}s {msg}", flush=True)

    if args.shape == "qwen3-0.6b":
        # max_window_layers follows the real config (= layer count; unused without sliding window)
        m.write_hf_model(args.out_dir, "qwen3", seed=args.seed, log=log, torch_dtype="bfloat16",
                         max_window_layers=m.QWEN3_0_6B["num_hidden_layers"], **m.QWEN3_0_6B)
    else:
        m.write_hf_model(args.out_dir, args.shape.split("-", 1)[1], seed=args.seed, log=log)
    log(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
