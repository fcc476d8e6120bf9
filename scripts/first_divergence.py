"""Name the first intermediate tensor where two backends differ.

Runs one prompt through the numpy integer spec (ref), the C++ core on each
CPU kernel set and, when named, the CUDA engine (backend "cuda"), records
every named intermediate (tok_embd, blk.N.attn_norm ... blk.N.residual,
output; python/intdet/trace.py) and prints, for each backend after the
first, the first tensor in forward order whose bits differ from the first
backend's, or that all agree. Exits 1 on any difference, 2 when a backend
cannot run (no CUDA GPU, say).

Usage: python scripts/first_divergence.py [-m MODEL] [--prompt TEXT | --ids 1,2,3]
           [--backends ref,scalar,avx2,cuda] [--threads N]
"""

from __future__ import annotations

import argparse
import sys

from intdet import _core
from intdet.errors import IntdetError
from intdet.model import Engine, load_model
from intdet.resolve import resolve_model
from intdet.tokenizer import encode
from intdet.trace import compare_backends, trace_names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="model (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--ids", default=None, help="comma-separated token ids instead of --prompt")
    isas = ",".join(_core.available_isas())
    ap.add_argument("--backends", default=None,
                    help=f"comma-separated, the first is the reference; ref, a CPU kernel set or cuda "
                         f"(default: ref,{isas})")
    ap.add_argument("--threads", type=int, default=None, help="threads of the C++ core (default: all cores)")
    a = ap.parse_args(argv)
    lm = load_model(resolve_model(a.model, progress=sys.stderr.isatty()))
    ids = [int(v) for v in a.ids.split(",")] if a.ids else encode(lm.tokenizer, lm.tok_meta, a.prompt)
    backends = a.backends.split(",") if a.backends else ["ref", *_core.available_isas()]
    if len(backends) < 2:
        ap.error("--backends needs at least two")
    engine = Engine(lm, "cpu", threads=a.threads)
    n = len(trace_names(lm.cfg))
    ok = True
    try:
        results = compare_backends(engine, ids, backends)
    except IntdetError as e:
        print(f"first_divergence: error: {e}", file=sys.stderr)
        return 2
    for backend, div in results:
        if div is None:
            print(f"{backend} vs {backends[0]}: all {n} tensors agree ({len(ids)} tokens)")
        else:
            ok = False
            print(f"{backend} vs {backends[0]}: first divergence at {div[0]}: {div[1]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
