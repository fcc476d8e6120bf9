"""intdet's own speed figures: prompt processing, decode, batched decode, peak RSS.

``run_bench(lm, ...)`` returns one dict per thread setting (see ``ROW_KEYS``):

* prompt processing: one ``State.forward`` of exactly ``prompt_tokens`` ids
  (``bench_prompt_ids``: a fixed English sentence, tokenized once and repeated,
  so every run and every engine gets the same ids);
* decode: ``gen_tokens`` greedy steps at batch 1 continuing that prompt, each
  step one ``forward`` of one token plus the integer argmax (the token picked
  from the prefill logits is not counted);
* with ``batch`` > 1, also ``batch`` sequences holding the same prompt,
  advanced together by ``Engine.forward_batch`` for ``gen_tokens`` steps:
  aggregate tok/s = batch * gen_tokens / seconds;
* peak RSS of this process so far (``peak_rss_bytes``: it only grows, so a later row
  includes everything before it) and the kernel set / thread count in use.

A warm-up runs before the first measurement, as llama-bench's: one prefill
of the whole prompt and one decode step on a throwaway sequence (page-in of
the weights, thread start-up, and the forward's activation buffers, which
stay allocated per thread). The timings are wall-clock: on a loaded machine they are
noisy; ``scripts/bench_cpu.py`` repeats them in fresh processes.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

from .errors import IntdetError, check_token_ids
from .model import Engine, LoadedModel
from .rss import peak_rss_bytes
from .sampling import Sampler

BENCH_TEXT = ("The quick brown fox jumps over the lazy dog, and the children watch it from the old stone bridge "
              "while the river runs quietly towards the sea. ")

ROW_KEYS = ("model", "isa", "threads_requested", "threads", "threads_used", "batch", "prompt_tokens", "gen_tokens",
            "prefill_s", "prefill_tok_s", "decode_s", "decode_tok_s", "batch_decode_s", "batch_decode_tok_s",
            "decode_tokens_hash", "peak_rss_bytes")


def bench_prompt_ids(lm: LoadedModel, n: int) -> list:
    """Exactly ``n`` token ids: ``BENCH_TEXT`` tokenized once (no BOS) and
    repeated, truncated to ``n``. Deterministic for a given tokenizer."""
    from .tokenizer import encode

    if n < 1:
        raise IntdetError(f"prompt_tokens: {n} must be >= 1", field="prompt_tokens")
    base = [int(t) for t in encode(lm.tokenizer, lm.tok_meta, BENCH_TEXT, add_bos=False)]
    base = [t for t in base if 0 <= t < lm.cfg["vocab_size"]]
    if not base:
        raise IntdetError(f"{lm.path}: the tokenizer gives no usable ids for the benchmark text")
    return (base * (n // len(base) + 1))[:n]


def _tokens_hash(tokens) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()[:12]


def _set_threads(engine: Engine, threads: int) -> int:
    """threads > 0: exactly that many; 0: auto (fewer while other processes
    keep cores busy). Returns the most a forward will use."""
    engine.set_threads(threads)
    return engine.threads


def _warm_up(engine: Engine, ids: list) -> None:
    seq = engine.new_state(len(ids) + 2)
    logits = seq.forward(ids)[-1]
    seq.forward([int(np.argmax(logits))])


def run_bench(lm: LoadedModel, prompt_tokens: int = 512, gen_tokens: int = 128, threads=(0,), batch: int = 1,
              prompt_ids=None, progress=None, keep_tokens: bool = False) -> list:
    """Measure prompt processing and decode for each thread count in
    ``threads`` (0 = auto); returns one dict per setting (keys
    ``ROW_KEYS``). ``prompt_ids`` overrides the default prompt (its length
    then sets ``prompt_tokens``). ``progress(msg)`` is called between phases.
    ``keep_tokens`` adds ``decode_tokens``, the greedy ids of the batch-1 decode.

    Raises IntdetError for sizes that do not fit the model's context."""
    if prompt_ids is None:
        prompt_ids = bench_prompt_ids(lm, prompt_tokens)
    prompt_ids = [int(t) for t in prompt_ids]
    prompt_tokens = len(prompt_ids)
    threads = list(threads) or [0]
    ctx = lm.cfg["context_length"]
    if prompt_tokens < 1:
        raise IntdetError("prompt_tokens: the prompt is empty", field="prompt_tokens")
    if gen_tokens < 1:
        raise IntdetError(f"gen_tokens: {gen_tokens} must be >= 1", field="gen_tokens")
    if batch < 1:
        raise IntdetError(f"batch: {batch} must be >= 1", field="batch")
    if prompt_tokens + gen_tokens > ctx:
        raise IntdetError(f"prompt_tokens: {prompt_tokens} + {gen_tokens} generated tokens exceed the context length "
                          f"{ctx}", field="prompt_tokens")
    check_token_ids(prompt_ids, lm.cfg["vocab_size"])
    for t in threads:
        if not 0 <= t <= 1024:
            raise IntdetError(f"threads: {t} must be in [0, 1024] (0 = auto)", field="threads")
    say = progress or (lambda msg: None)
    engine = Engine(lm, "cpu")
    sampler = Sampler()
    n_total = prompt_tokens + gen_tokens
    rows = []
    for i, t in enumerate(threads):
        n_threads = _set_threads(engine, t)
        if i == 0:
            _warm_up(engine, prompt_ids)
        say(f"threads {n_threads}: prompt processing ({prompt_tokens} tokens)")
        seq = engine.new_state(n_total)
        t0 = time.perf_counter()
        logits = seq.forward(prompt_ids)[-1]
        prefill_s = time.perf_counter() - t0

        say(f"threads {n_threads}: decode ({gen_tokens} tokens, batch 1)")
        tok = sampler.pick(logits, seq.n_past)
        out = []
        t0 = time.perf_counter()
        for _ in range(gen_tokens):
            logits = seq.forward([tok])[-1]
            tok = sampler.pick(logits, seq.n_past)
            out.append(tok)
        decode_s = time.perf_counter() - t0
        del seq

        batch_s = None
        if batch > 1:
            say(f"threads {n_threads}: decode ({gen_tokens} tokens, batch {batch})")
            seqs = [engine.new_state(n_total) for _ in range(batch)]
            outs = engine.forward_batch(seqs, [prompt_ids] * batch)  # not timed
            toks = [sampler.pick(o[-1], s.n_past) for o, s in zip(outs, seqs)]
            t0 = time.perf_counter()
            for _ in range(gen_tokens):
                outs = engine.forward_batch(seqs, [[k] for k in toks])
                toks = [sampler.pick(o[-1], s.n_past) for o, s in zip(outs, seqs)]
            batch_s = time.perf_counter() - t0
            del seqs, outs

        rows.append({
            "model": lm.path,
            "isa": engine.isa,
            "threads_requested": t,
            "threads": n_threads,
            "threads_used": engine.last_forward_threads(),  # auto: the latest decode step's
            "batch": batch,
            "prompt_tokens": prompt_tokens,
            "gen_tokens": gen_tokens,
            "prefill_s": prefill_s,
            "prefill_tok_s": prompt_tokens / prefill_s if prefill_s > 0 else None,
            "decode_s": decode_s,
            "decode_tok_s": gen_tokens / decode_s if decode_s > 0 else None,
            "batch_decode_s": batch_s,
            "batch_decode_tok_s": batch * gen_tokens / batch_s if batch_s else None,
            "decode_tokens_hash": _tokens_hash(out),
            "peak_rss_bytes": peak_rss_bytes(),
        })
        if keep_tokens:
            rows[-1]["decode_tokens"] = [int(k) for k in out]
    return rows


def format_table(rows: list) -> str:
    """Plain-text table, one line per row of ``run_bench``."""
    if not rows:
        return ""
    r0 = rows[0]
    rate = lambda v: f"{v:.1f}" if v else "-"  # noqa: E731
    batched = r0["batch"] > 1
    head = ["isa", "threads", f"pp{r0['prompt_tokens']} tok/s", f"tg{r0['gen_tokens']} tok/s"]
    if batched:
        head.append(f"tg{r0['gen_tokens']} x{r0['batch']} tok/s")
    head += ["peak RSS MiB", "tokens hash"]
    lines = []
    for r in rows:
        threads = str(r["threads"]) if r["threads_requested"] else f"auto ({r['threads_used']})"
        cells = [r["isa"], threads, rate(r["prefill_tok_s"]), rate(r["decode_tok_s"])]
        if batched:
            cells.append(rate(r["batch_decode_tok_s"]))
        cells += [f"{r['peak_rss_bytes'] / 2**20:.1f}", r["decode_tokens_hash"]]
        lines.append(cells)
    return "\n".join([f"model {r0['model']}", text_table(head, lines)])


def text_table(head: list, lines: list, left=(0,)) -> str:
    """Rows of cells (str) under ``head``, each column as wide as its widest
    cell, two spaces apart; the columns in ``left`` left-aligned, the others
    right-aligned (numbers)."""
    w = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    fmt = lambda cs: "  ".join(c.ljust(w[i]) if i in left else c.rjust(w[i]) for i, c in enumerate(cs))  # noqa: E731
    return "\n".join([fmt(head)] + [fmt(c) for c in lines])
