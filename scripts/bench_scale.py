#!/usr/bin/env python3
"""Large models on a small machine (issue 37): conversion, load and speed of
1.7B, 4B and 8B shapes, intdet beside llama.cpp, in one run.

    python scripts/bench_scale.py [--shape qwen3-1.7b ...] [--threads 2] [--repeats 1]
                                  [--work-dir DIR] [--no-speed] [--keep] [--json OUT]

For each shape (``intdet random-model --shape``: the published configs'
sizes, bf16 shards, random weights; written once into --work-dir):
  1. intdet convert (int8) and llama.cpp's convert_hf_to_gguf.py --outtype
     q8_0 (the llama-cpp-python sdist's, scripts/fetch_llamacpp_convert.sh)
     of the same checkpoint: wall time and peak RSS of each (the child's
     ru_maxrss from wait4; it includes this small process's ~30 MB at fork);
  2. intdet load (load_model + the CPU engine): wall time, RSS after and
     peak, against the model file's size;
  3. speed (unless --no-speed): scripts/bench_cpu.py's bench_model, intdet
     against llama-bench (-fa 1) on the Q8_0 file, prompt of P tokens and
     G decode tokens at depth P; decode GB/s = bytes of weights read per
     token x tok/s, against this machine's read bandwidth
     (scripts/bench_bandwidth.c: T threads summing 1 GiB, best of 5; numpy
     where no C compiler is found).
Prints a table with ratios (these VMs are noisy: compare within one run).
Needs about 2.1x the bf16 size of each shape in free disk; --keep keeps
the files for a later run (default: the GGUF and the intdet model are
removed after their shape, the source is kept).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
SHAPES = ("qwen3-1.7b", "qwen3-4b", "llama3-8b")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def timed_peak(cmd: list, env: dict | None = None) -> dict:
    """Run cmd: wall seconds, stdout and the child's peak RSS (wait4 on its
    pid: its own rusage). Exits with the child's stderr on failure."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    # read both pipes on threads, then reap with wait4 for the child's own rusage
    import threading

    bufs = {}

    def drain(name, f):
        bufs[name] = f.read()

    ts = [threading.Thread(target=drain, args=(n, f)) for n, f in (("out", p.stdout), ("err", p.stderr))]
    for t in ts:
        t.start()
    _, status, ru = os.wait4(p.pid, 0)
    for t in ts:
        t.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{bufs['err'].decode(errors='replace')[-3000:]}")
    return {"seconds": wall, "stdout": bufs["out"].decode(errors="replace"), "peak_rss_bytes": ru.ru_maxrss * 1024}


def dir_bytes(path: str, suffix: str = "") -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path) if n.endswith(suffix))


_LOAD = r"""
import json, sys, time
t0 = time.perf_counter()
from intdet.model import Engine, load_model
lm = load_model(sys.argv[1])
e = Engine(lm, "cpu")
t1 = time.perf_counter()
s = e.new_state(16)
s.forward([1, 2, 3])
def status(k):
    for line in open("/proc/self/status"):
        if line.startswith(k + ":"):
            return int(line.split()[1]) * 1024
print(json.dumps({"load_s": t1 - t0, "rss_bytes": status("VmRSS"), "peak_rss_bytes": status("VmHWM")}))
"""

_BANDWIDTH = r"""
import sys, threading, time
import numpy as np
T = int(sys.argv[1])
a = np.ones((1 << 30) // 8, np.float64)
parts = np.array_split(a, T)
best = 0.0
for _ in range(3):
    ts = [threading.Thread(target=np.sum, args=(p,)) for p in parts]
    t0 = time.perf_counter()
    for t in ts: t.start()
    for t in ts: t.join()
    best = max(best, a.nbytes / (time.perf_counter() - t0))
print(best)
"""


def read_bandwidth(threads: int, work: str) -> tuple:
    """(bytes/s, how): scripts/bench_bandwidth.c compiled here, else numpy."""
    cc = shutil.which("cc") or shutil.which("gcc")
    exe = os.path.join(work, "bench_bandwidth")
    if cc and subprocess.run([cc, "-O3", "-march=native", "-fopenmp", os.path.join(HERE, "bench_bandwidth.c"), "-o",
                              exe], capture_output=True).returncode == 0:
        out = subprocess.run([exe, str(threads)], capture_output=True, text=True, check=True).stdout
        return float(out.strip()), "bench_bandwidth.c, 1 GiB, best of 5"
    out = timed_peak([sys.executable, "-c", _BANDWIDTH, str(threads)])["stdout"]
    return float(out.strip()), "numpy sum over 1 GiB, best of 3"


def weight_bytes_per_token(model_dir: str) -> int:
    """Bytes of weights a decode step reads: every linear's codes and scales,
    the lm_head (the embedding itself when tied), not the embedding rows."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    from intdet.safetensors_io import SafetensorsFile

    st = SafetensorsFile(os.path.join(model_dir, "model.safetensors"))
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    total = 0
    for n in st.names():
        dt, shape = st.info(n)
        size = {"I8": 1, "U8": 1, "I16": 2, "I32": 4}.get(dt, 4)
        for d in shape:
            size *= d
        if n.startswith("tok_embd.") and not (cfg["tied_embeddings"] and n == "tok_embd.q"):
            continue
        if n.startswith(("rope", "blk.")) and (".cos" in n or ".sin" in n):
            continue
        total += size
    return total


def main(argv=None) -> int:
    import bench_cpu

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", choices=SHAPES, help="repeatable (default: all three)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    from intdet.resolve import cache_dir

    ap.add_argument("--work-dir", default=os.path.join(cache_dir(), "scale"))
    ap.add_argument("--no-speed", action="store_true", help="conversion and load only")
    ap.add_argument("--no-llama-convert", action="store_true", help="leave out llama.cpp's converter (and speed)")
    ap.add_argument("--llama-bench", default=None, help="llama-bench binary (default: build it, bench_cpu.py's way)")
    ap.add_argument("--keep", action="store_true", help="keep the intdet model and the GGUF of each shape")
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--table-from", default=None, metavar="JSON",
                    help="print the table of an earlier --json run, with the bandwidth measured now")
    a = ap.parse_args(argv)
    if a.table_from:
        d = json.load(open(a.table_from))
        bw, _ = read_bandwidth(d["threads"], a.work_dir)
        a.threads = d["threads"]
        print(format_table(d["results"], bw, a))
        return 0
    shapes = a.shape or list(SHAPES)
    os.makedirs(a.work_dir, exist_ok=True)
    py = sys.executable
    env = dict(os.environ)
    results = []
    bw, how = read_bandwidth(a.threads, a.work_dir)
    log(f"read bandwidth ({a.threads} threads, {how}): {bw / 1e9:.1f} GB/s")
    llama_bench = None if (a.no_speed or a.no_llama_convert) else bench_cpu.ensure_llama_bench(a.llama_bench)
    for shape in shapes:
        r = {"shape": shape}
        src = os.path.join(a.work_dir, f"{shape}-hf")
        if not os.path.isdir(src):
            log(f"{shape}: writing the random checkpoint")
            timed_peak([py, "-m", "intdet", "random-model", src, "--shape", shape])
        r["source_bytes"] = dir_bytes(src, ".safetensors")
        out = os.path.join(a.work_dir, f"{shape}-int8")
        shutil.rmtree(out, ignore_errors=True)
        log(f"{shape}: intdet convert")
        c = timed_peak([py, "-m", "intdet", "convert", src, "-o", out], env)
        r["intdet_convert"] = {"seconds": c["seconds"], "peak_rss_bytes": c["peak_rss_bytes"],
                               "output_bytes": dir_bytes(out, ".safetensors")}
        gguf = os.path.join(a.work_dir, f"{shape}-q8_0.gguf")
        if not a.no_llama_convert:
            log(f"{shape}: llama.cpp convert_hf_to_gguf.py --outtype q8_0")
            conv_dir = subprocess.run(["bash", os.path.join(HERE, "fetch_llamacpp_convert.sh")], capture_output=True,
                                      text=True, env=dict(env, PYTHON=py), check=True).stdout.strip().splitlines()[-1]
            c = timed_peak([py, "-c", bench_cpu._LLAMACPP_RUNNER, conv_dir, "qwen2", src, "--outfile", gguf,
                            "--outtype", "q8_0"], dict(env, NO_LOCAL_GGUF="1"))
            r["llamacpp_convert"] = {"seconds": c["seconds"], "peak_rss_bytes": c["peak_rss_bytes"],
                                     "output_bytes": os.path.getsize(gguf)}
        log(f"{shape}: intdet load")
        ld = timed_peak([py, "-c", _LOAD, out], env)
        r["intdet_load"] = json.loads(ld["stdout"].strip().splitlines()[-1])
        if not a.no_speed and not a.no_llama_convert:
            log(f"{shape}: speed, intdet against llama-bench")
            m = {"name": shape, "note": "random weights, bf16 source", "intdet": out, "llama": gguf}
            res = bench_cpu.bench_model(None, m, [a.threads], a.repeats, a.prompt_tokens, a.gen_tokens,
                                        llama_bench=llama_bench)
            row = res["rows"][0]
            r["speed"] = {k: row[k] for k in ("intdet", "llama_bench")}
            r["weight_bytes_per_token"] = wpt = weight_bytes_per_token(out)
            r["decode_gb_s"] = wpt * row["intdet"]["decode_tok_s"] / 1e9
        results.append(r)
        if not a.keep:
            shutil.rmtree(out, ignore_errors=True)
            if os.path.exists(gguf):
                os.unlink(gguf)
    print(format_table(results, bw, a))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"bandwidth_bytes_s": bw, "threads": a.threads, "results": results}, f, indent=2)
    return 0


def format_table(results: list, bw: float, a) -> str:
    G = 2**30
    lines = [f"cpu: {cpu_model()}; {a.threads} threads; read bandwidth {bw / 1e9:.1f} GB/s",
             "| shape | bf16 source | intdet convert s / peak | llama.cpp q8_0 s / peak | convert time ratio | "
             "peak - output | load s / RSS | pp tok/s intdet / llama-bench | tg tok/s at depth | decode GB/s (of bw) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ic, lc, ld = r["intdet_convert"], r.get("llamacpp_convert"), r["intdet_load"]
        conv = f"{ic['seconds']:.1f} / {ic['peak_rss_bytes'] / G:.2f} GiB"
        peer = f"{lc['seconds']:.1f} / {lc['peak_rss_bytes'] / G:.2f} GiB" if lc else "-"
        ratio = f"{lc['seconds'] / ic['seconds']:.2f}x" if lc else "-"
        over = f"{(ic['peak_rss_bytes'] - ic['output_bytes']) / G:+.2f} GiB"
        load = f"{ld['load_s']:.1f} / {ld['rss_bytes'] / G:.2f} GiB (file {ic['output_bytes'] / G:.2f})"
        if "speed" in r:
            i, lb = r["speed"]["intdet"], r["speed"]["llama_bench"]
            pp = f"{i['prefill_tok_s']:.1f} / {lb['prefill_tok_s']:.1f} = {i['prefill_tok_s'] / lb['prefill_tok_s']:.2f}x"
            tg = f"{i['decode_tok_s']:.2f} / {lb['decode_tok_s']:.2f} = {i['decode_tok_s'] / lb['decode_tok_s']:.2f}x"
            gbs = f"{r['decode_gb_s']:.1f} ({r['decode_gb_s'] * 1e9 / bw:.0%})"
        else:
            pp = tg = gbs = "-"
        lines.append(f"| {r['shape']} | {r['source_bytes'] / G:.2f} GiB | {conv} | {peer} | {ratio} | {over} | {load} | "
                     f"{pp} | {tg} | {gbs} |")
    return "\n".join(lines)


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
