#!/usr/bin/env python3
"""The host side of a --device webgpu decode step: dispatches per step and
the CPU time to record, encode and submit them, with the GPU's work taken
out (submit, map and read-back stubbed), so the figure is the host's alone
on any adapter (lavapipe included).

    python scripts/webgpu_host_cost.py [-m MODEL] [--steps 100] [--repeats 4] [--json]

A step's host time is paid before the GPU starts on it, so it bounds the
decode rate from above whatever the GPU: 1000 / ms tok/s. Prints the best
of ``--repeats`` runs of ``--steps`` decode steps (process CPU time)."""

from __future__ import annotations

import argparse
import json
import sys
import time


def measure(model=None, steps: int = 100, repeats: int = 4) -> dict:
    """{"dispatches": per decode step, "host_ms": best CPU ms per step, "adapter": name}."""
    import numpy as np

    import intdet
    from intdet.webgpu import backend as W
    from intdet.webgpu import kernels as K

    llm = intdet.load(model, device="webgpu")
    m = llm.engine._model
    s = W.State(m, steps + 16)
    W.forward(m, s, np.arange(1, 6, dtype=np.int32), 0)
    counts = []
    run = K.Recorder.run

    def counting_run(self, read=None):
        counts.append(sum(1 for c in self.cmds if c[0] != "copy"))
        return run(self, read)

    import wgpu.backends.wgpu_native as native

    saved = [(native.GPUQueue, "submit"), (native.GPUBuffer, "map_sync"), (native.GPUBuffer, "read_mapped"),
             (native.GPUBuffer, "unmap"), (K.Recorder, "run")]
    saved = [(c, n, getattr(c, n)) for c, n in saved]
    native.GPUQueue.submit = lambda self, cbs: None
    native.GPUBuffer.map_sync = lambda self, *a, **k: None
    native.GPUBuffer.read_mapped = lambda self, off, n: memoryview(bytes(n))
    native.GPUBuffer.unmap = lambda self: None
    K.Recorder.run = counting_run
    try:
        best = float("inf")
        tok = np.array([7], np.int32)
        for _ in range(repeats):
            t = time.process_time()
            for i in range(steps):
                W.forward(m, s, tok, 5 + i)
            best = min(best, (time.process_time() - t) / steps * 1e3)
    finally:
        for c, n, f in saved:
            setattr(c, n, f)
    return {"dispatches": counts[-1], "host_ms": round(best, 3), "adapter": W.device_name(),
            "linears": "coop" if m.kernels.coop else "channel"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None, help="any source -m accepts (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.repeats < 1:
        print("webgpu_host_cost: --steps and --repeats must be >= 1", file=sys.stderr)
        return 2
    r = measure(a.model, a.steps, a.repeats)
    if a.json:
        print(json.dumps(r))
    else:
        print(f"{r['dispatches']} dispatches per decode step, host {r['host_ms']:.2f} ms of CPU per step "
              f"(GPU stubbed; at most {1000 / r['host_ms']:.0f} tok/s from the host), {r['linears']} linears, "
              f"adapter {r['adapter']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
