#!/usr/bin/env python3
"""The side-by-side benchmark's rows and results file (scripts/device-check.sh,
issue 50): intdet, llama.cpp and torch on the same weights.

A row: {"engine": "intdet" | "llama.cpp" | "torch", "model": "qwen3-0.6b" |
"llama3-8b", "phase": "decode" | "prefill", "batch": rows decoded together (1
for a prefill), "tokens": the prompt length (decode: the depth the decode
starts at), "tok_s": tokens per second, "backend": "cuda" | "webgpu" | "cpu"}. The
benchmarks append rows to one JSONL file; ``write`` turns it into

    {"device": GPU name, "hashes_equal": bool, "rows": [...]}

and prints (and appends to a markdown file) the rows and the ratios intdet /
llama.cpp and intdet / torch for every (model, phase, batch, tokens) that
both engines measured on one backend (--backend, default cuda).

    python scripts/bench_results.py add-llama-bench ROWS MODEL FILE [--backend B]    (llama-bench -o jsonl)
    python scripts/bench_results.py add-batched-bench ROWS MODEL FILE [--backend B]  (--output-format jsonl)
    python scripts/bench_results.py write ROWS --device NAME --hashes-equal yes|no --json OUT [--md RESULTS.md]
                                          [--backend B]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

ENGINES = ("intdet", "llama.cpp", "torch")
MODELS = ("qwen3-0.6b", "llama3-8b")
PHASES = ("decode", "prefill")
BACKENDS = ("cuda", "webgpu", "cpu")  # cpu: the rehearsal on a machine without a GPU


def make_row(engine: str, model: str, phase: str, batch: int, tokens: int, tok_s: float, backend: str = "cuda") -> dict:
    """One checked row. ValueError naming the field when a value is off
    (a name outside its list, a batch < 1, a prefill batch other than 1,
    tokens < 0, a rate that is not a finite positive number)."""
    for field, value, allowed in (("engine", engine, ENGINES), ("model", model, MODELS), ("phase", phase, PHASES),
                                  ("backend", backend, BACKENDS)):
        if value not in allowed:
            raise ValueError(f"{field}: {value!r} is not one of {', '.join(allowed)}")
    for field, value, low in (("batch", batch, 1), ("tokens", tokens, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{field}: {value!r} must be an integer >= {low}")
    if phase == "prefill" and batch != 1:
        raise ValueError(f"batch: a prefill row has batch 1, not {batch}")
    if isinstance(tok_s, bool) or not isinstance(tok_s, (int, float)) or not math.isfinite(tok_s) or tok_s <= 0:
        raise ValueError(f"tok_s: {tok_s!r} must be a finite number > 0")
    return {"engine": engine, "model": model, "phase": phase, "batch": batch, "tokens": tokens,
            "tok_s": round(float(tok_s), 2), "backend": backend}


def append_row(path: str, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def read_rows(path: str) -> list:
    """The rows of a JSONL file (none if it does not exist), each checked by
    make_row; ValueError naming the file and line otherwise."""
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                rows.append(make_row(r["engine"], r["model"], r["phase"], r["batch"], r["tokens"], r["tok_s"],
                                     r.get("backend", "cuda")))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: {e}") from None
    return rows


def _json_lines(text: str) -> list:
    """The JSON objects of the lines that hold one (the programs' logs share the stream)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def llama_bench_rows(text: str, model: str, backend: str = "cuda") -> list:
    """Rows from ``llama-bench -o jsonl``: a test with n_gen > 0 and no
    prompt is decode at batch 1 from depth n_depth (tg128); one with a prompt
    and no n_gen is a prefill of n_prompt tokens (pp2048)."""
    rows = []
    for r in _json_lines(text):
        if "avg_ts" not in r:
            continue
        n_prompt, n_gen, depth = int(r.get("n_prompt", 0)), int(r.get("n_gen", 0)), int(r.get("n_depth", 0))
        if n_gen > 0 and n_prompt == 0:
            rows.append(make_row("llama.cpp", model, "decode", 1, depth, float(r["avg_ts"]), backend))
        elif n_prompt > 0 and n_gen == 0:
            rows.append(make_row("llama.cpp", model, "prefill", 1, n_prompt + depth, float(r["avg_ts"]), backend))
    return rows


def batched_bench_rows(text: str, model: str, backend: str = "cuda") -> list:
    """Decode rows from ``llama-batched-bench --output-format jsonl``: batch
    pl, decode speed speed_tg after a pp-token prompt."""
    return [make_row("llama.cpp", model, "decode", int(r["pl"]), int(r["pp"]), float(r["speed_tg"]), backend)
            for r in _json_lines(text) if {"pl", "pp", "speed_tg"} <= r.keys()]


def results(device: str, hashes_equal: bool, rows: list) -> dict:
    if not isinstance(hashes_equal, bool):
        raise ValueError(f"hashes_equal: {hashes_equal!r} must be true or false")
    return {"device": str(device), "hashes_equal": hashes_equal, "rows": list(rows)}


def _key(r: dict) -> tuple:
    return (r["model"], r["phase"], r["batch"], r["tokens"])


def ratios(rows: list, backend: str = "cuda") -> list:
    """For each (model, phase, batch, tokens) that intdet measured on backend:
    {"model", "phase", "batch", "tokens", "intdet", "llama.cpp", "torch",
    "vs_llama.cpp", "vs_torch"} (rates; a ratio is intdet / the other, None
    where the other is missing). The last row of a key wins."""
    by = {}
    for r in rows:
        if r["backend"] == backend:
            by.setdefault(_key(r), {})[r["engine"]] = r["tok_s"]
    out = []
    for key in sorted(k for k in by if "intdet" in by[k]):
        e = by[key]
        d = dict(zip(("model", "phase", "batch", "tokens"), key))
        d.update({n: e.get(n) for n in ENGINES})
        for other in ("llama.cpp", "torch"):
            d["vs_" + other] = round(e["intdet"] / e[other], 3) if e.get(other) else None
        out.append(d)
    return out


def _f(v, fmt="{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def markdown(res: dict, backend: str = "cuda") -> str:
    """The results as markdown: every row, then the ratio table of backend."""
    lines = [f"Device: {res['device']}; every hash equal to the CPU's pin: {'yes' if res['hashes_equal'] else 'NO'}", "",
             "| engine | backend | model | phase | batch | tokens | tok/s |", "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['engine']} | {r['backend']} | {r['model']} | {r['phase']} | {r['batch']} | {r['tokens']} "
                     f"| {r['tok_s']:.1f} |")
    lines += ["", f"Ratios on {backend}:", "", "| model | phase | batch | tokens | intdet tok/s | llama.cpp tok/s | torch tok/s "
              "| intdet / llama.cpp | intdet / torch |", "|---|---|---|---|---|---|---|---|---|"]
    for d in ratios(res["rows"], backend):
        lines.append(f"| {d['model']} | {d['phase']} | {d['batch']} | {d['tokens']} | {_f(d['intdet'])} "
                     f"| {_f(d['llama.cpp'])} | {_f(d['torch'])} | {_f(d['vs_llama.cpp'], '{:.2f}x')} "
                     f"| {_f(d['vs_torch'], '{:.2f}x')} |")
    return "\n".join(lines) + "\n"


def write_json(path: str, res: dict) -> None:
    """Whole or not at all: a temporary file renamed into place."""
    tmp = path + ".partial"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_results.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("add-llama-bench", "add-batched-bench"):
        p = sub.add_parser(name)
        p.add_argument("rows")
        p.add_argument("model", choices=MODELS)
        p.add_argument("file", help="the program's output")
        p.add_argument("--backend", choices=BACKENDS, default="cuda")
    p = sub.add_parser("write")
    p.add_argument("rows")
    p.add_argument("--device", required=True)
    p.add_argument("--hashes-equal", required=True, choices=("yes", "no"))
    p.add_argument("--json", required=True, help="results file to write")
    p.add_argument("--md", help="markdown file to append the tables to")
    p.add_argument("--backend", choices=BACKENDS, default="cuda", help="the backend of the ratio table")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "write":
            res = results(a.device, a.hashes_equal == "yes", read_rows(a.rows))
            write_json(a.json, res)
            text = markdown(res, a.backend)
            if a.md:
                with open(a.md, "a") as f:
                    f.write(text)
            print(text, end="")
            return 0
        try:
            with open(a.file, errors="replace") as f:
                text = f.read()
        except OSError as e:
            raise ValueError(f"{a.file}: {e.strerror}") from None
        rows = (llama_bench_rows if a.cmd == "add-llama-bench" else batched_bench_rows)(text, a.model, a.backend)
        if not rows:
            raise ValueError(f"{a.file}: no result line found")
        for r in rows:
            append_row(a.rows, r)
            print(f"llama.cpp {r['model']} {r['phase']} batch {r['batch']} tokens {r['tokens']}: {r['tok_s']:.1f} tok/s")
        return 0
    except ValueError as e:
        print(f"bench_results: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
