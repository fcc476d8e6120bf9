#!/usr/bin/env python3
"""intdet compress against gzip -9, bzip2 -9, xz -9e and zstd -19, side by side.

For each text: bits per byte, compression and decompression speed (KB/s of
original bytes, the best of --repeats runs), CPU seconds (this process's,
all threads; for the peers their processes': on a shared machine the CPU
time says what the work costs when the wall time does not) and a round-trip
check, for every tool in one run, with each tool's size as a ratio to
xz -9e's. intdet runs in-process (the model is loaded once; load time is not
counted) through the same library calls as `intdet compress` / `decompress`.

On the first text only, the trade-offs:
  --ctx A B ...      other chunk sizes (tokens per chunk = context): bits/byte
                     and compression speed (decompression too with --ctx-decompress)
  --batches A B ...  decompression of the default-ctx file at other batch sizes
                     (rows per forward_batch step; never more than the chunks)

Texts (each cut to its first --bytes N bytes when given, at a line end):
  wikitext  ../shared/data/wikitext-2-raw-test.txt (or --wikitext PATH)
  gpl3      /usr/share/common-licenses/GPL-3 (prose)
  python    the sources of Python's argparse, json/decoder.py and textwrap modules, concatenated (code)

  python scripts/bench_compress.py --bytes 131072 --threads 2 --repeats 1
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:  # an installed intdet (CI installs the wheel: the source tree has no compiled _core)
    import intdet._core  # noqa: F401
except ImportError:  # a source checkout built in place
    sys.path.insert(0, os.path.join(ROOT, "python"))

PEERS = {
    "gzip -9": (["gzip", "-9", "-c"], ["gzip", "-d", "-c"]),
    "bzip2 -9": (["bzip2", "-9", "-c"], ["bzip2", "-d", "-c"]),
    "xz -9e": (["xz", "-9e", "-c", "-T1"], ["xz", "-d", "-c"]),
    "zstd -19": (["zstd", "-19", "-c", "-q"], ["zstd", "-d", "-c", "-q"]),
}
NAN = float("nan")


def texts(args) -> dict:
    import argparse as _ap
    import json.decoder as _jd
    import textwrap

    wiki = args.wikitext or os.path.join(ROOT, "..", "shared", "data", "wikitext-2-raw-test.txt")
    out = {}
    if os.path.isfile(wiki):
        out["wikitext"] = open(wiki, "rb").read()
    gpl = "/usr/share/common-licenses/GPL-3"
    if os.path.isfile(gpl):
        out["gpl3"] = open(gpl, "rb").read()
    out["python"] = b"".join(open(m.__file__, "rb").read() for m in sorted((_ap, _jd, textwrap),
                                                                            key=lambda m: m.__name__))
    if args.bytes:
        for k, v in out.items():
            cut = v.rfind(b"\n", 0, args.bytes)
            out[k] = v[:cut + 1 if cut > 0 else args.bytes]
    return {k: v for k, v in out.items() if not args.only or k in args.only}


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(fn, repeats: int, cpu=cpu_self):
    """(result of the last run, best wall seconds, CPU seconds of that best run)."""
    best = None
    for _ in range(max(1, repeats)):
        c0, t0 = cpu(), time.perf_counter()
        res = fn()
        w, c = time.perf_counter() - t0, cpu() - c0
        if best is None or w < best[0]:
            best = (w, c)
    return res, best[0], best[1]


def run_peer(name, data, repeats):
    comp, dec = PEERS[name]
    if not shutil.which(comp[0]):
        return None
    z, cs, cc = timed(lambda: subprocess.run(comp, input=data, capture_output=True, check=True).stdout, repeats,
                      cpu_children)
    back, ds, dc = timed(lambda: subprocess.run(dec, input=z, capture_output=True, check=True).stdout, repeats,
                         cpu_children)
    return dict(size=len(z), comp_s=cs, comp_cpu=cc, dec_s=ds, dec_cpu=dc, ok=back == data)


def compress_intdet(engine, data, ctx, repeats):
    from intdet.compress import codec

    def once():
        out = io.BytesIO()
        st = codec.compress_stream(engine, io.BytesIO(data).read, out, ctx=ctx)
        return out.getvalue(), st

    (blob, st), s, c = timed(once, repeats)
    return blob, dict(size=len(blob), comp_s=s, comp_cpu=c, tokens=st.tokens, chunks=st.chunks,
                      stored=st.stored_chunks, fallback=st.byte_fallback_chunks,
                      dec_s=NAN, dec_cpu=NAN, ok=None)


def decompress_intdet(engine, blob, data, batch, repeats):
    from intdet.compress import codec

    def once():
        back = io.BytesIO()
        codec.decompress_stream(engine, io.BytesIO(blob), back, "bench", batch=batch)
        return back.getvalue()

    back, s, c = timed(once, repeats)
    return dict(dec_s=s, dec_cpu=c, ok=back == data)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="intdet model (default SmolLM2-135M-Instruct)")
    ap.add_argument("--bytes", type=int, default=0, help="cut each text to its first N bytes (0 = whole)")
    ap.add_argument("--only", nargs="*", help="texts to run (wikitext gpl3 python)")
    ap.add_argument("--wikitext", default=None)
    ap.add_argument("--ctx", type=int, nargs="*", default=[], help="extra chunk sizes for the first text")
    ap.add_argument("--ctx-decompress", action="store_true", help="decompress the --ctx rows too")
    ap.add_argument("--default-ctx", type=int, default=None, help="chunk size of the main rows (default: codec's)")
    ap.add_argument("--batch", type=int, default=None, help="decompression batch of the main rows (default: codec's)")
    ap.add_argument("--batches", type=int, nargs="*", default=[], help="extra decompression batches, first text")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1, help="runs of every measurement; the fastest counts")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = ap.parse_args()

    from intdet.compress import codec
    from intdet.model import Engine, load_model
    from intdet.resolve import resolve_model
    from intdet.rss import peak_rss_bytes

    ctx0 = args.default_ctx or codec.DEFAULT_CTX
    batch0 = args.batch or codec.DEFAULT_BATCH
    engine = Engine(load_model(resolve_model(args.model, progress=False)), threads=args.threads or None)
    load0 = os.getloadavg()[0]
    t_start = time.perf_counter()
    rows = []
    for name, data in texts(args).items():
        n = len(data)
        first = not rows
        res = {p: run_peer(p, data, args.repeats) for p in PEERS}
        print(f"# {name}: {n} bytes", file=sys.stderr, flush=True)
        main_tool = f"intdet ctx {ctx0} batch {batch0}"
        blob, r = compress_intdet(engine, data, ctx0, args.repeats)
        r.update(decompress_intdet(engine, blob, data, batch0, args.repeats))
        res[main_tool] = r
        print(f"#   {main_tool}: {r}", file=sys.stderr, flush=True)
        if first:
            for b in args.batches:
                rb = dict(r, comp_s=NAN, comp_cpu=NAN)
                rb.update(decompress_intdet(engine, blob, data, b, args.repeats))
                res[f"intdet ctx {ctx0} batch {b} (decompress)"] = rb
                print(f"#   batch {b}: {rb}", file=sys.stderr, flush=True)
            for c in args.ctx:
                cblob, rc = compress_intdet(engine, data, c, args.repeats)
                tool = f"intdet ctx {c} batch {batch0}"
                if args.ctx_decompress:
                    rc.update(decompress_intdet(engine, cblob, data, batch0, args.repeats))
                else:
                    tool = f"intdet ctx {c} (compress only)"
                res[tool] = rc
                print(f"#   ctx {c}: {rc}", file=sys.stderr, flush=True)
        xz = res["xz -9e"]["size"] if res.get("xz -9e") else None
        for tool, r in res.items():
            if r is None:
                continue
            rows.append(dict(text=name, bytes=n, tool=tool, **r, bpb=8 * r["size"] / n,
                             vs_xz=r["size"] / xz if xz else NAN,
                             comp_kbs=n / r["comp_s"] / 1e3, dec_kbs=n / r["dec_s"] / 1e3))
    print(f"{'text':9} {'bytes':>8} {'tool':34} {'bits/byte':>9} {'vs xz':>6} {'comp KB/s':>10} {'decomp KB/s':>11} "
          f"{'comp CPU s':>10} {'dec CPU s':>9} {'tokens':>7} round-trip")
    for r in rows:
        ok = {True: "ok", False: "FAILED", None: "-"}[r["ok"]]
        print(f"{r['text']:9} {r['bytes']:8d} {r['tool']:34} {r['bpb']:9.4f} {r['vs_xz']:6.3f} "
              f"{r['comp_kbs']:10.2f} {r['dec_kbs']:11.2f} {r['comp_cpu']:10.2f} {r['dec_cpu']:9.2f} "
              f"{r.get('tokens', '-'):>7} {ok}")
    import multiprocessing

    from intdet import _core

    print(f"# intdet: threads {_core.last_forward_threads() if hasattr(_core, 'last_forward_threads') else '-'}, "
          f"repeats {args.repeats} (fastest), cpus {multiprocessing.cpu_count()}, load {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f}, peak RSS {peak_rss_bytes() >> 20} MiB, {time.perf_counter() - t_start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    sys.exit(0 if all(r["ok"] is not False for r in rows) else 1)


if __name__ == "__main__":
    main()
