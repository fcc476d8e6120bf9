#!/usr/bin/env python3
"""intdet compress against gzip -9, bzip2 -9, xz -9e and zstd -19, side by side.

For each text: bits per byte, compression and decompression speed (MB/s of
original bytes) and a round-trip check, for every tool in one run, with each
tool's size as a ratio to xz -9e's. intdet runs in-process (the model is
loaded once; load time is not counted) through the same library calls as
`intdet compress` / `decompress`. `--ctx A B ...` adds rows for other chunk
sizes (compression only, on the first text), to show what context costs.

Texts (each cut to its first --bytes N bytes when given, at a line end):
  wikitext  ../shared/data/wikitext-2-raw-test.txt (or --wikitext PATH)
  gpl3      /usr/share/common-licenses/GPL-3 (prose)
  python    the sorted source of Python's argparse, json and textwrap modules (code)

  python scripts/bench_compress.py --bytes 32768 --threads 1
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

PEERS = {
    "gzip -9": (["gzip", "-9", "-c"], ["gzip", "-d", "-c"]),
    "bzip2 -9": (["bzip2", "-9", "-c"], ["bzip2", "-d", "-c"]),
    "xz -9e": (["xz", "-9e", "-c", "-T1"], ["xz", "-d", "-c"]),
    "zstd -19": (["zstd", "-19", "-c", "-q"], ["zstd", "-d", "-c", "-q"]),
}


def texts(args) -> dict:
    import json as _json  # noqa: F401  (the module whose source is read)
    import argparse as _ap
    import textwrap

    wiki = args.wikitext or os.path.join(ROOT, "..", "shared", "data", "wikitext-2-raw-test.txt")
    out = {}
    if os.path.isfile(wiki):
        out["wikitext"] = open(wiki, "rb").read()
    gpl = "/usr/share/common-licenses/GPL-3"
    if os.path.isfile(gpl):
        out["gpl3"] = open(gpl, "rb").read()
    out["python"] = b"".join(open(m.__file__, "rb").read() for m in sorted((_ap, _json.decoder, textwrap),
                                                                            key=lambda m: m.__name__))
    if args.bytes:
        for k, v in out.items():
            cut = v.rfind(b"\n", 0, args.bytes)
            out[k] = v[:cut + 1 if cut > 0 else args.bytes]
    return {k: v for k, v in out.items() if not args.only or k in args.only}


def run_peer(name, data):
    comp, dec = PEERS[name]
    if not shutil.which(comp[0]):
        return None
    t0 = time.perf_counter()
    z = subprocess.run(comp, input=data, capture_output=True, check=True).stdout
    t1 = time.perf_counter()
    back = subprocess.run(dec, input=z, capture_output=True, check=True).stdout
    t2 = time.perf_counter()
    return dict(size=len(z), comp_s=t1 - t0, dec_s=t2 - t1, ok=back == data)


def run_intdet(engine, data, ctx, batch, decompress=True):
    from intdet.compress import codec

    out = io.BytesIO()
    st = codec.compress_stream(engine, io.BytesIO(data).read, out, ctx=ctx)
    row = dict(size=out.tell(), comp_s=st.seconds, tokens=st.tokens, chunks=st.chunks,
               stored=st.stored_chunks, fallback=st.byte_fallback_chunks, dec_s=float("nan"), ok=None)
    if decompress:
        back = io.BytesIO()
        d = codec.decompress_stream(engine, io.BytesIO(out.getvalue()), back, "bench", batch=batch)
        row.update(dec_s=d.seconds, ok=back.getvalue() == data)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="intdet model (default SmolLM2-135M-Instruct)")
    ap.add_argument("--bytes", type=int, default=0, help="cut each text to its first N bytes (0 = whole)")
    ap.add_argument("--only", nargs="*", help="texts to run (wikitext gpl3 python)")
    ap.add_argument("--wikitext", default=None)
    ap.add_argument("--ctx", type=int, nargs="*", default=[], help="extra chunk sizes for the first text")
    ap.add_argument("--default-ctx", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = ap.parse_args()

    from intdet.model import Engine, load_model
    from intdet.resolve import resolve_model
    from intdet.rss import peak_rss_bytes

    engine = Engine(load_model(resolve_model(args.model, progress=False)), threads=args.threads or None)
    rows = []
    for name, data in texts(args).items():
        n = len(data)
        res = {p: run_peer(p, data) for p in PEERS}
        print(f"# {name}: {n} bytes", file=sys.stderr, flush=True)
        res[f"intdet ctx {args.default_ctx}"] = run_intdet(engine, data, args.default_ctx, args.batch)
        print(f"#   {res[f'intdet ctx {args.default_ctx}']}", file=sys.stderr, flush=True)
        if not rows:
            for c in args.ctx:
                res[f"intdet ctx {c} (compress only)"] = run_intdet(engine, data, c, args.batch, decompress=False)
                print(f"#   ctx {c}: {res[f'intdet ctx {c} (compress only)']}", file=sys.stderr, flush=True)
        xz = res["xz -9e"]["size"] if res.get("xz -9e") else None
        for tool, r in res.items():
            if r is None:
                continue
            rows.append(dict(text=name, bytes=n, tool=tool, **r, bpb=8 * r["size"] / n,
                             vs_xz=r["size"] / xz if xz else float("nan"),
                             comp_mbs=n / r["comp_s"] / 1e6, dec_mbs=n / r["dec_s"] / 1e6 if r["dec_s"] == r["dec_s"] else float("nan")))
    print(f"{'text':9} {'bytes':>8} {'tool':32} {'bits/byte':>9} {'vs xz':>6} {'comp KB/s':>10} {'decomp KB/s':>11} round-trip")
    for r in rows:
        ok = {True: "ok", False: "FAILED", None: "-"}[r["ok"]]
        print(f"{r['text']:9} {r['bytes']:8d} {r['tool']:32} {r['bpb']:9.4f} {r['vs_xz']:6.3f} "
              f"{r['comp_mbs'] * 1000:10.2f} {r['dec_mbs'] * 1000:11.2f} {ok}")
    import multiprocessing

    print(f"# intdet: threads {engine._core.num_threads() if hasattr(engine, '_core') else '-'}, batch {args.batch}, "
          f"cpus {multiprocessing.cpu_count()}, load {os.getloadavg()[0]:.1f}, peak RSS {peak_rss_bytes() >> 20} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    sys.exit(0 if all(r["ok"] is not False for r in rows) else 1)


if __name__ == "__main__":
    main()
