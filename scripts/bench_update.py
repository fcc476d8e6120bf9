"""LLM.update_weights against a convert + reload of the same weights.

Writes a random checkpoint (``intdet random-model``'s shapes; default the
Qwen3-0.6B shape in bf16), converts and loads it, then for ``--rounds``
rounds makes new bf16 torch tensors in memory (every weight moved a little,
as an RL step does) and times (a) ``llm.update_weights(tensors)`` and (b)
saving them as a Hugging Face dir + ``intdet convert`` + loading the
result, checking both give the same model_version and generation hash.
Prints one JSON object: seconds per path, their ratio, and the RSS growth of
the update (the issue's bound: one model file's size).

    python scripts/bench_update.py [--shape qwen3-0.6b] [--rounds 2] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed)")
    a = ap.parse_args(argv)

    import torch
    from safetensors.torch import load_file, save_file

    import intdet
    from intdet.convert import convert
    from intdet.random_model import write_random_model

    work = a.dir or tempfile.mkdtemp(prefix="intdet-bench-update-")
    try:
        src = os.path.join(work, "hf")
        if not os.path.isdir(src):
            write_random_model(src, a.shape)
        m0 = os.path.join(work, "m0")
        if not os.path.isdir(m0):
            convert(src, m0, progress=False)
        llm = intdet.LLM(m0)
        base = {}
        for f in sorted(os.listdir(src)):
            if f.endswith(".safetensors"):
                base.update(load_file(os.path.join(src, f)))
        sp = intdet.SamplingParams(max_tokens=8, temperature=0, seed=0)
        file_bytes = os.path.getsize(os.path.join(m0, "model.safetensors"))
        rows = []
        for r in range(a.rounds):
            g = torch.Generator().manual_seed(r + 1)
            new = {k: (v.float() + 0.01 * torch.randn(v.shape, generator=g)).to(torch.bfloat16)
                   for k, v in base.items()}
            rss0 = rss_bytes()
            t0 = time.perf_counter()
            version = llm.update_weights(new)
            t_update = time.perf_counter() - t0
            rss_growth = rss_bytes() - rss0
            h_update = llm.generate("The capital of France is", sp).hash
            d = os.path.join(work, f"hf{r}")
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(src, d, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
            t0 = time.perf_counter()
            save_file(new, os.path.join(d, "model.safetensors"))
            out = convert(d, os.path.join(work, f"m{r + 1}"), progress=False, force=True)
            fresh = intdet.LLM(out)
            fresh.model_sha256
            t_convert = time.perf_counter() - t0
            same = fresh.model_sha256 == version and fresh.generate("The capital of France is", sp).hash == h_update
            rows.append({"update_s": round(t_update, 2), "save_convert_load_s": round(t_convert, 2),
                         "ratio": round(t_convert / t_update, 2), "update_rss_growth_mib": rss_growth >> 20,
                         "same_bits": same})
            del fresh
        print(json.dumps({"shape": a.shape, "model_file_mib": file_bytes >> 20, "cpus": os.cpu_count(),
                          "rounds": rows}, indent=1))
        return 0 if all(r["same_bits"] for r in rows) else 1
    finally:
        if a.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
