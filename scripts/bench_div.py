"""Division microbenchmark (issue 50): ns per exact int64 division on the CUDA
device, the bit-serial udiv_u64 against intmath.h's DivBy (a multiply-high by a
Newton reciprocal), for a per-element divisor (the GLU's case) and a per-row
one (RMSNorm, quant8), on the GLU's worst operands (numerators 2^59..2^60,
divisors 2^30..2^31: 30-bit quotients). Each pair of modes must give the same
sums, and a sample is checked against Python's exact floor division.

Usage: python scripts/bench_div.py [--emu] [--count N] [--reps R]
  --emu: the host emulator (built as tests/engine/test_cuda.py builds it), for
  rehearsals without a GPU: the checks are real, the times are not the GPU's.
Exit 1 when a check fails.
"""

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ["udiv_u64, divisor per element", "DivBy, divisor per element", "udiv_u64, divisor per row",
         "DivBy, divisor per row"]


def module(emu):
    if not emu:
        from intdet import _cuda

        if _cuda.device_count() == 0:
            sys.exit(f"bench_div: no CUDA GPU ({_cuda.no_device_reason()}); --emu runs the emulator")
        return _cuda
    for sub in ("tests", os.path.join("tests", "engine")):
        sys.path.insert(0, os.path.join(ROOT, sub))
    from test_cuda import build_emu_module  # the emulator build the tests use (cached in build/cuda-emu)

    return build_emu_module()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--emu", action="store_true", help="run on the host emulator (a rehearsal)")
    ap.add_argument("--count", type=int, default=None, help="threads (default 1M on a GPU, 2048 emulated)")
    ap.add_argument("--reps", type=int, default=None, help="divisions per thread (default 64, 4 emulated)")
    args = ap.parse_args()
    count = args.count or (2048 if args.emu else 1 << 20)
    reps = args.reps or (4 if args.emu else 64)
    mod = module(args.emu)
    rng = np.random.default_rng(0)
    a = rng.integers(2**59, 2**60, count, dtype=np.int64)
    b = rng.integers(2**30, 2**31, count, dtype=np.int64)
    mod.ops.div_bench(a[:256], b[:256], 1, 1)  # warm-up: module load, first launch
    sums, ns = [], []
    for mode in range(4):
        s, t = mod.ops.div_bench(a, b, reps, mode)
        sums.append(s)
        ns.append(t)
        print(f"{MODES[mode]:32s} {t / (count * reps):8.3f} ns per division ({count} x {reps}, {t / 1e3:.1f} us)")
    ok = np.array_equal(sums[0], sums[1]) and np.array_equal(sums[2], sums[3])
    for i in range(0, count, max(1, count // 64)):  # exact integers, a sample
        x, d = int(a[i]), int(b[i])
        ok &= int(sums[1][i]) == sum((x + r) // (d + r) for r in range(reps))
        ok &= int(sums[3][i]) == sum((x + r) // d for r in range(reps))
    print(f"speed-up per element {ns[0] / max(ns[1], 1):.1f}x, per row {ns[2] / max(ns[3], 1):.1f}x; "
          f"sums {'equal' if ok else 'DIFFER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
