#!/usr/bin/env python3
"""Per-kernel cudaEvent tables for scripts/device-check.sh (a GPU is needed):

    python scripts/cuda_kernel_profile.py MODEL_INT [--bw BYTES_PER_S] [--ctx 64,1024] [--prefill 2048]

Decode (batch 1, no graphs) at each position after a random prompt of CTX
tokens, then a PREFILL-token prefill with the attention on the tensor cores
(attn_mma_kernel) and on the flash-decoding split (ops.set_attn_path), the
two paths' last-row logits checked equal. Each table sums intdet._cuda.profile's
steps by name: launches, time, bytes read, GB/s and the time the bytes would
take at BW (default 4.8e12, an H200's HBM3e; an H100's is 3.35e12)."""

from __future__ import annotations

import argparse
import sys
from collections import OrderedDict


def table(title: str, steps, rows: int, bw: float) -> str:
    """Markdown for profile steps [(name, ns, bytes, launches), ...] summed by
    name in first-seen order; ``rows``: tokens the steps produced (tok/s)."""
    agg = OrderedDict()
    for name, ns, nbytes, launches in steps:
        a = agg.setdefault(name, [0, 0, 0])
        a[0] += ns
        a[1] += nbytes
        a[2] += launches
    tot_ns = sum(a[0] for a in agg.values())
    tot_b = sum(a[1] for a in agg.values())
    out = [f"\n### {title} ({len(steps)} steps, {sum(a[2] for a in agg.values())} launches)\n",
           f"| step | launches | time (us) | share | bytes read (MB) | GB/s | bound at {bw / 1e12:.1f} TB/s (us) |",
           "|---|---|---|---|---|---|---|"]
    for name, (ns, nbytes, launches) in agg.items():
        share = 100 * ns / tot_ns if tot_ns else 0.0
        out.append(f"| {name} | {launches} | {ns / 1e3:.1f} | {share:.1f}% | {nbytes / 1e6:.2f} | "
                   f"{nbytes / ns if ns else 0.0:.0f} | {nbytes / bw * 1e6:.1f} |")
    out.append(f"| **total** | | {tot_ns / 1e3:.1f} | | {tot_b / 1e6:.1f} | {tot_b / tot_ns if tot_ns else 0.0:.0f} | "
               f"{tot_b / bw * 1e6:.1f} |")
    rate = f"{rows * 1e9 / tot_ns:.0f}" if tot_ns else "-"
    bound = f"{rows * bw / tot_b:.0f}" if tot_b else "-"
    out.append(f"\nevent-timed: {rate} tok/s; bandwidth bound {bound} tok/s "
               "(events add a little per step; graphs remove launch gaps)")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_int", help="a converted intdet model folder")
    ap.add_argument("--bw", type=float, default=4.8e12, help="memory bandwidth in bytes/s for the bound column")
    ap.add_argument("--ctx", default="64,1024", help="decode positions (prompt lengths), comma-separated")
    ap.add_argument("--prefill", type=int, default=2048)
    a = ap.parse_args(argv)
    try:
        ctxs = [int(c) for c in a.ctx.split(",") if c]
    except ValueError:
        ap.error(f"--ctx: {a.ctx!r} is not a comma-separated list of integers")
    if a.bw <= 0 or a.prefill < 1 or any(c < 1 for c in ctxs):
        ap.error("--bw, --prefill and every --ctx must be positive")

    import numpy as np

    from intdet import _cuda
    from intdet.model import load_model

    if _cuda.device_count() < 1:
        print(f"cuda_kernel_profile: error: no CUDA device ({_cuda.no_device_reason()})", file=sys.stderr)
        return 1
    lm = load_model(a.model_int)
    m = _cuda.Model(lm.cfg, lm.tensors, False)
    rng = np.random.default_rng(0)
    vocab = int(lm.cfg["vocab_size"])
    for ctx in ctxs:
        s = _cuda.State(m, ctx + 8)
        _cuda.forward(m, s, rng.integers(0, vocab, ctx).astype(np.int32), 0, False)
        _cuda.profile(m, s, np.array([1], np.int32), ctx)  # warm-up
        _, steps = _cuda.profile(m, s, np.array([2], np.int32), ctx + 1)
        print(table(f"decode, batch 1, position {ctx + 1}", steps, 1, a.bw), flush=True)

    prompt = rng.integers(0, vocab, a.prefill).astype(np.int32)
    ref = None
    try:
        for path, label in ((2, "tensor cores (attn_mma_kernel)"), (1, "flash-decoding split")):
            _cuda.ops.set_attn_path(path)
            _cuda.profile(m, _cuda.State(m, a.prefill + 8), prompt, 0)  # warm-up
            logits, steps = _cuda.profile(m, _cuda.State(m, a.prefill + 8), prompt, 0)
            if ref is None:
                ref = logits
            print(f"\nlast-row logits equal to the tensor-core path's: {np.array_equal(logits, ref)}")
            print(table(f"prefill {a.prefill} tokens, attention: {label}", steps, a.prefill, a.bw), flush=True)
    finally:
        _cuda.ops.set_attn_path(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
