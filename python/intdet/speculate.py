"""Prompt-lookup drafts for speculative decoding (scheduler.py).

Speculative decoding feeds a sequence's last token together with k guessed
next tokens ("drafts") in one forward call and keeps each draft while the
token the sampler picks from the previous row's logits equals it. In intdet
this cannot change a bit: a row's logits are the same in any batch and any
prefill split (docs/chain-hash.md), and the sampler's draw is keyed by
(seed, position), so every kept token, its logits and the chain hash are
those of plain decoding; rejected drafts only cost their rows, and their KV
entries are dropped (``State.truncate``).

Drafts come from the text itself (prompt lookup: Saxena 2023,
"Prompt Lookup Decoding"; vLLM's ``ngram`` speculator, llama.cpp's lookup
decoding): the longest suffix of the context, of ``max_n`` (3) down to
``min_n`` (2) tokens, that occurred earlier, and the tokens that followed
its latest earlier occurrence (a single recurring token predicted too
little to pay for its rows in scripts/bench_spec.py). It pays off where the output repeats its input
(code edits, summaries, extraction, RL rollouts over a fixed context).

Or drafts come from a smaller model with the same tokenizer
(``DraftModel``; Leviathan et al. 2023, "Fast Inference from Transformers
via Speculative Decoding"; llama.cpp's ``-md``, vLLM's draft ``model``): it
decodes k tokens greedily from the same context, on its own KV cache kept in
step with the tokens the target keeps. Verification is the same, so the
output is the same bits whatever drafts: only the speed depends on them.

Back-off (``DraftState``): a draft with nothing accepted makes the request
wait 1, 2, 4, ... up to 16 steps before drafting again, and the next draft
length is one more than the last accepted run, so text that the lookup
cannot predict costs almost nothing over plain decoding.
"""

from __future__ import annotations

import numpy as np


def ngram_drafts(context, k: int, max_n: int = 3, min_n: int = 2) -> list:
    """Up to k tokens following the latest earlier occurrence of the longest
    suffix of ``context`` (int token ids) of max_n..min_n tokens; [] when
    no suffix recurs or k < 1."""
    L = len(context)
    if k < 1 or L < min_n + 1:
        return []
    a = np.asarray(context, dtype=np.int64)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        pat = a[L - n:]
        # windows a[i:i+n] for i in [0, L-n): earlier starts only (the suffix itself is at L-n)
        win = np.lib.stride_tricks.sliding_window_view(a[:L - 1], n)
        hits = np.flatnonzero((win == pat).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n  # the token after the latest earlier occurrence
            return [int(t) for t in a[start:start + k]]
    return []


class DraftState:
    """One request's draft bookkeeping: how many tokens to draft next, the
    back-off after rejected drafts, and the counts reported to users."""

    MAX_SKIP = 16

    def __init__(self, k_max: int):
        self.k_max = k_max
        self.k = k_max
        self.skip = 0  # steps left without drafting
        self.backoff = 1
        self.drafted = 0
        self.accepted = 0
        self.steps = 0  # forward calls that carried drafts

    def want(self) -> int:
        """Draft length for this step (0: skip)."""
        if self.skip > 0:
            self.skip -= 1
            return 0
        return self.k

    def record(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self.drafted += drafted
        self.accepted += accepted
        self.steps += 1
        if accepted == 0:
            self.skip = self.backoff
            self.backoff = min(2 * self.backoff, self.MAX_SKIP)
            self.k = 1
        else:
            self.backoff = 1
            self.k = min(self.k_max, accepted + 1 if accepted < drafted else 2 * drafted)


class DraftModel:
    """Drafts from a smaller model sharing the target's tokenizer.

    engine: the draft model's ``Engine`` (any backend); target_vocab: the
    target's vocabulary size (drafts are ids below it). Each request gets a
    draft sequence (``DraftSeq``) on first use; ``propose`` brings it to the
    request's context (dropping cached drafts the target did not keep, then
    feeding what it lacks) and decodes k tokens by argmax (lowest id on
    ties). Its KV cache is the draft model's and is not counted in the
    scheduler's kv_bytes.
    """

    def __init__(self, engine, target_vocab: int):
        self.engine = engine
        self.vocab = min(int(engine.vocab_size), int(target_vocab))

    def new_seq(self, max_len: int) -> "DraftSeq":
        return DraftSeq(self.engine.new_state(max_len))

    def propose(self, ds: "DraftSeq", context, k: int) -> list:
        """Up to k greedy draft tokens after ``context`` (int ids, the
        target's prompt and kept tokens); [] when k < 1 or no room."""
        k = min(k, ds.seq.max_len - len(context))
        if k < 1:
            return []
        keep = 0  # the cached tokens that are still the context's
        for a, b in zip(ds.tokens, context):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(context) - 1)  # the last context token is fed again for its logits
        if keep < ds.seq.n_past:
            ds.seq.truncate(keep)
            del ds.tokens[keep:]
        feed = [int(t) for t in context[keep:]]
        out = []
        for _ in range(k):
            logits = ds.seq.forward(feed)[-1]
            ds.tokens.extend(feed)
            tok = int(np.argmax(logits[:self.vocab]))
            out.append(tok)
            feed = [tok]
        return out


class DraftSeq:
    """One request's draft sequence: the draft model's KV cache and the ids
    it holds (``tokens``, the last drafts included until dropped)."""

    def __init__(self, seq):
        self.seq = seq
        self.tokens: list = []


def check_same_tokenizer(target_tok, draft_tok, what: str) -> None:
    """IntdetError (naming ``what``) unless the two tokenizers map the same
    strings to the same ids."""
    from .errors import IntdetError

    a, b = target_tok.get_vocab(with_added_tokens=True), draft_tok.get_vocab(with_added_tokens=True)
    if a != b:
        diff = sorted(set(a.items()) ^ set(b.items()), key=lambda x: x[1])[:1]
        where = f" (first difference: {diff[0][0]!r} -> {diff[0][1]})" if diff else ""
        raise IntdetError(f"{what}: its tokenizer is not the model's ({len(b)} vs {len(a)} tokens{where}); "
                          "a draft model must share the tokenizer")
