#!/usr/bin/env python3
"""What structured output costs: decode tok/s with a JSON schema against
the same model unconstrained, batch 1 and batch B, in one process,
alternating rounds.

    python scripts/bench_structured.py [-m MODEL] [--tokens 128] [--batch 8] [--rounds 3] [--threads N] [--json OUT]

The default model (SmolLM2-135M-Instruct) through its chat template, greedy
(batch B: B requests submitted together, greedy, then sampled at
temperature 0.8 with seeds 0..B-1). The constrained run asks for a list of people under a schema
whose array is long enough that it runs --tokens tokens (a minimum item
count), so both runs decode the same number of tokens; the plain run
answers the same request unconstrained (--tokens tokens unless it ends). Printed per round and as the median:
decode tok/s (generated tokens / time after the first token, over all
sequences), the ratio structured/plain (the target is >= 0.90), and whether
every structured run gives the same tokens and hashes (it must: the tool
exits 1 otherwise). Sampled rows favour the structured run: the sampler's
host work shrinks to the allowed ids. (That outputs validate is tested in
tests/api/test_structured.py; here the schema's 40 items outlast --tokens.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

SCHEMA = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "minItems": 40,
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                               "city": {"type": "string", "maxLength": 24}},
                "required": ["name", "age", "city"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["people"],
    "additionalProperties": False,
}
ASK = "List people with their name, age and city, as JSON."


def run(llm, params_list, msgs):
    """(decode tok/s over all sequences, completions)."""
    streams = [llm.stream(llm.chat_ids(msgs), p) for p in params_list]
    # step all streams together: the scheduler batches them
    live = list(range(len(streams)))
    iters = [iter(s) for s in streams]
    first = [None] * len(streams)
    while live:
        for i in list(live):
            try:
                ch = next(iters[i])
                if ch.token is not None and first[i] is None:
                    first[i] = time.perf_counter()
            except StopIteration:
                live.remove(i)
    t1 = time.perf_counter()
    outs = [s.close() for s in streams]
    firsts = [f for f in first if f is not None]
    n = sum(max(len(c.tokens) - 1, 0) for c in outs)
    return n / max(t1 - max(firsts), 1e-9), outs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=None, metavar="OUT")
    a = ap.parse_args()

    import intdet
    from intdet import SamplingParams

    llm = intdet.load(a.model, threads=a.threads or None, max_batch=max(a.batch, 1))
    so = {"json": SCHEMA}
    msgs = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    setups = {
        "batch 1": ([SamplingParams(max_tokens=a.tokens)],
                    [SamplingParams(max_tokens=a.tokens, structured_outputs=so)]),
        f"batch {a.batch} greedy": ([SamplingParams(max_tokens=a.tokens)] * a.batch,
                                    [SamplingParams(max_tokens=a.tokens, structured_outputs=so)] * a.batch),
        f"batch {a.batch} T=0.8": ([SamplingParams(max_tokens=a.tokens, temperature=0.8, seed=i) for i in range(a.batch)],
                             [SamplingParams(max_tokens=a.tokens, temperature=0.8, seed=i, structured_outputs=so)
                              for i in range(a.batch)]),
    }
    llm.grammar(intdet.StructuredOutputsParams(json=SCHEMA))  # compiled once, outside the timing
    rows, ok = {}, True
    for name, (plain_p, struct_p) in setups.items():
        ratios, tp, ts = [], [], []
        first_struct = None
        for r in range(a.rounds):
            if r % 2:  # alternate which runs first
                s_rate, outs = run(llm, struct_p, msgs(ASK))
                p_rate, _ = run(llm, plain_p, msgs(ASK))
            else:
                p_rate, _ = run(llm, plain_p, msgs(ASK))
                s_rate, outs = run(llm, struct_p, msgs(ASK))
            bits = [(c.tokens, c.hash) for c in outs]
            if first_struct is None:
                first_struct = bits
            elif bits != first_struct:
                print(f"{name}: structured runs differ between rounds", file=sys.stderr)
                ok = False
            tp.append(p_rate)
            ts.append(s_rate)
            ratios.append(s_rate / p_rate)
            print(f"{name} round {r + 1}: plain {p_rate:.1f} tok/s, structured {s_rate:.1f} tok/s, "
                  f"ratio {s_rate / p_rate:.3f}", flush=True)
        rows[name] = {"plain_tok_s": statistics.median(tp), "structured_tok_s": statistics.median(ts),
                      "ratio": statistics.median(ratios), "tokens": [len(c.tokens) for c in outs],
                      "sample": outs[0].text[:160]}
    print()
    print(f"{'setup':<16} {'plain tok/s':>12} {'structured tok/s':>17} {'ratio':>7}")
    for name, r in rows.items():
        print(f"{name:<16} {r['plain_tok_s']:>12.1f} {r['structured_tok_s']:>17.1f} {r['ratio']:>7.3f}")
    print(f"sample: {rows['batch 1']['sample']!r}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
