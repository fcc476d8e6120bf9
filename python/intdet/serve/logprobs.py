"""Log-probabilities in the responses' shapes: completions' ``logprobs``
(tokens, token_logprobs, behaviour_logprobs, top_logprobs, text_offset) and
chat's per-token entries (logprob, behaviour_logprob, ...); numbers from
the fixed-point log-softmax (intdet/logprobs.py) and the sampler's own
distribution (docs/receipts.md)."""

from __future__ import annotations

from ..logprobs import to_float


def completion_logprobs(llm, c, echo: bool, k: int, text_start: int = 0) -> dict:
    """Completions' ``logprobs`` of Completion ``c`` (its prompt's first when ``echo``)."""
    toks, lps, tops, blps = [], [], [], []
    if echo:
        pl = c.prompt_logprobs if c.prompt_logprobs is not None else [None] * len(c.prompt_ids)
        for tok, lp in zip(c.prompt_ids, pl):
            toks.append(tok)
            lps.append(None if lp is None else to_float(lp.logprob_q))
            tops.append(None if lp is None else top_dict(llm, lp, k))
            blps.append(None)  # a prompt token was not sampled
    for lp in c.logprobs or ():
        toks.append(lp.token)
        lps.append(to_float(lp.logprob_q))
        tops.append(top_dict(llm, lp, k))
        blps.append(lp.behaviour_logprob)
    strs = [llm.token_text(t) for t in toks]
    offsets, at = [], text_start
    for s in strs:
        offsets.append(at)
        at += len(s)
    return {"tokens": strs, "token_logprobs": lps, "behaviour_logprobs": blps, "top_logprobs": tops,
            "text_offset": offsets}


def top_dict(llm, lp, k: int) -> dict:
    d = {}
    for t, q in lp.top[:k]:
        d.setdefault(llm.token_text(t), to_float(q))
    d.setdefault(llm.token_text(lp.token), to_float(lp.logprob_q))
    return d


def chat_logprob(llm, lp, k: int) -> dict:
    s = llm.token_text(lp.token)
    return {"token": s, "logprob": to_float(lp.logprob_q), "behaviour_logprob": lp.behaviour_logprob,
            "bytes": list(s.encode("utf-8")),
            "top_logprobs": [{"token": llm.token_text(t), "logprob": to_float(q),
                              "bytes": list(llm.token_text(t).encode("utf-8"))} for t, q in lp.top[:k]]}
