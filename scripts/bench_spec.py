#!/usr/bin/env python3
"""Speculative decoding (prompt lookup, ``--spec-ngram K``, or a draft model,
``--spec-draft MODEL``) against plain decoding, batch 1, in one process,
alternating, with the outputs compared.

    python scripts/bench_spec.py [-m MODEL] [--spec 5] [--draft MODEL] [--tokens 128] [--rounds 3]
                                 [--threads N] [--json OUT]
    python scripts/bench_spec.py --row-cost [--max-rows 8] [-m MODEL] [--threads N]

Workloads (the default model, SmolLM2-135M-Instruct, through its chat
template, greedy):
  - repeat: "Repeat the following text exactly" + a WikiText-2 paragraph
    (the text the lookup predicts: copy, edit, extract, summarise);
  - code: "Rename the variable x to total in this function" + a function;
  - open: an open question (nothing to look up: the back-off case).
Each round runs every workload plain and drafted, alternately; the table
gives median decode tok/s (generated tokens / time after the first token),
the ratio, drafts kept / drafted, and whether tokens and chain hash are
identical (they must be: the tool exits 1 otherwise).

``--row-cost``: instead, the price of verifying drafts on this CPU: the
median time of one forward call of n = 1..``--max-rows`` rows (all their
logits) after 300 cached positions, and its ratio to one row. Speculation
with k drafts pays when the expected kept tokens exceed the cost of k + 1
rows in units of one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

WIKI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data",
                    "wikitext-2-raw-test.txt")

CODE = '''def mean(values):
    x = 0
    for v in values:
        x = x + v
    if len(values) == 0:
        return 0
    return x / len(values)
'''


def workloads() -> dict:
    para = ("Robert Boulter is an English film , television and theatre actor . He had a guest starring role on the "
            "television series The Bill in 2000 . This was followed by a starring role in the play Herons written "
            "by Simon Stephens , which was performed in 2001 at the Royal Court Theatre .")
    if os.path.isfile(WIKI):
        with open(WIKI, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f if len(ln.strip()) > 400]
        if lines:
            para = lines[0][:700]
    # WikiText's tokenized spacing (" , ", " @-@ ") is not how text is written: undo it, so the
    # workload is a copy task a model does, not a rewrite of odd spacing
    for a, b in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" , ", ", "), (" . ", ". "), (" ; ", "; "),
                 (" : ", ": "), (" 's", "'s"), ("( ", "("), (" )", ")"), (' " ', ' "')):
        para = para.replace(a, b)
    para = para.rsplit(". ", 1)[0] + "."  # whole sentences
    return {
        "repeat": f"Repeat the following text exactly, word for word:\n\n{para}",
        "code": f"Rename the variable x to total in this Python function and print the whole function:\n\n{CODE}",
        "open": "Write a short story about a lighthouse keeper who finds a strange map.",
    }


def run(llm, ids, n):
    from intdet.api import SamplingParams

    t0 = time.perf_counter()
    t_first = None
    count = 0
    for ch in llm.stream(ids, SamplingParams(max_tokens=n, temperature=0)):
        if ch.token is not None:
            count += 1
            t_first = t_first or time.perf_counter()
        if ch.completion is not None:
            c = ch.completion
    t_end = time.perf_counter()
    dec = (count - 1) / (t_end - t_first) if count > 1 else 0.0
    return c, dec, t_first - t0


def cpu_model() -> str:
    """The CPU's model name: bench_scale.cpu_model, the scripts' one reader of /proc/cpuinfo."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:  # also when this file is loaded by path (tests)
        sys.path.insert(0, here)
    from bench_scale import cpu_model as read

    return read()


def row_cost(llm, max_rows: int, repeats: int = 15) -> list:
    """[(n, median ms)] of one forward call of n rows (all logits) on a state
    holding 300 positions (fewer if the context is shorter), truncated back
    after each call."""
    st = llm.engine.new_state()
    vocab = llm.engine.vocab_size
    base = max(1, min(300, st.max_len - max_rows))
    st.forward([(7 * i) % vocab for i in range(base)])
    out = []
    for n in range(1, max_rows + 1):
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            st.forward([(11 * i + 3) % vocab for i in range(n)], all_logits=True)
            ts.append(time.perf_counter() - t)
            st.truncate(base)
        out.append((n, 1e3 * statistics.median(ts)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--spec", type=int, default=5, help="drafts per step (--spec-ngram K, or --spec-draft-max K)")
    ap.add_argument("--draft", default=None, metavar="MODEL",
                    help="draft with this model (--spec-draft MODEL) instead of prompt lookup")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--row-cost", action="store_true", help="print the cost of a forward call of 1..N rows instead")
    ap.add_argument("--max-rows", type=int, default=8, help="with --row-cost: N (1-64)")
    a = ap.parse_args(argv)
    if not 1 <= a.max_rows <= 64:
        ap.error(f"--max-rows: {a.max_rows} must be in [1, 64]")
    from intdet.api import LLM
    from intdet.chat import conversation_ids

    if a.row_cost:
        llm = LLM(a.model, threads=a.threads, max_batch=1)
        cpu = cpu_model()
        print(f"cpu: {cpu}; one forward call of n rows after 300 positions, median of 15")
        print("| rows | ms | cost in rows of one |")
        print("|---|---|---|")
        cost = row_cost(llm, a.max_rows)
        for n, ms in cost:
            print(f"| {n} | {ms:.2f} | {ms / cost[0][1]:.2f} |")
        if a.json_out:
            with open(a.json_out, "w") as f:
                json.dump([{"rows": n, "ms": ms} for n, ms in cost], f, indent=2)
        return 0

    plain = LLM(a.model, threads=a.threads, max_batch=1)
    spec = LLM(plain.lm, threads=a.threads, max_batch=1, spec_tokens=a.spec, draft_model=a.draft)
    res = {}
    same = True
    for name, text in workloads().items():
        ids = conversation_ids(plain.lm, [{"role": "user", "content": text}])
        rp, rs = [], []
        for r in range(a.rounds):
            cp, dp, _ = run(plain, ids, a.tokens)
            cs, ds, _ = run(spec, ids, a.tokens)
            rp.append(dp)
            rs.append(ds)
            same &= (cp.tokens, cp.hash) == (cs.tokens, cs.hash)
            print(f"{name} round {r + 1}: plain {dp:.1f} tok/s, drafted {ds:.1f} tok/s "
                  f"({cs.spec_accepted}/{cs.spec_drafted} drafts kept, {len(cs.tokens)} tokens)", file=sys.stderr)
        res[name] = {"plain_tok_s": statistics.median(rp), "spec_tok_s": statistics.median(rs),
                     "kept": cs.spec_accepted, "drafted": cs.spec_drafted, "tokens": len(cs.tokens),
                     "identical": (cp.tokens, cp.hash) == (cs.tokens, cs.hash), "text": cs.text[:200]}
    cpu = cpu_model()
    how = f"--spec-draft {a.draft} --spec-draft-max {a.spec}" if a.draft else f"--spec-ngram {a.spec}"
    print(f"cpu: {cpu}; batch 1, greedy, {a.tokens} tokens, {how}, median of {a.rounds}")
    print("| workload | plain tok/s | drafted tok/s | speed-up | drafts kept / drafted | tokens and hash identical |")
    print("|---|---|---|---|---|---|")
    for name, r in res.items():
        print(f"| {name} | {r['plain_tok_s']:.1f} | {r['spec_tok_s']:.1f} | {r['spec_tok_s'] / r['plain_tok_s']:.2f}x | "
              f"{r['kept']} / {r['drafted']} | {'yes' if r['identical'] else 'NO'} |")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(res, f, indent=2)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
