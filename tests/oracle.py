"""The reference generation loop of the tests: the plainest loop there is
(one sequence, the prompt in chunks, then one forward call per token, the
host's Sampler.pick, the chain hash), independent of the scheduler that the
product runs (scheduler.py), so tests can compare the two. Not product
code: nothing in python/intdet uses it."""

from __future__ import annotations

from intdet.generate import PREFILL_CHUNK, Generation, check_prompt
from intdet.hashing import ChainHash
from intdet.sampling import Sampler


def generate(engine, prompt_ids, max_new_tokens: int, sampler: Sampler | None = None, eos_ids=(), on_token=None,
             prefill_chunk: int = PREFILL_CHUNK, truncate: str | None = None, bos_id=None) -> Generation:
    """Prefill ``prompt_ids`` (in calls of ``prefill_chunk`` tokens, 0 = one
    call) then decode up to ``max_new_tokens`` tokens; stops after an id in
    ``eos_ids`` (kept and hashed), at ``max_new_tokens``, at the end of the
    context, or when ``on_token(id)`` returns True (``stop == "stop"``)."""
    sampler = sampler or Sampler()
    n_given = len(prompt_ids)
    prompt_ids = check_prompt(prompt_ids, engine.context_length, engine.vocab_size, max_new_tokens, truncate, bos_id)
    g = Generation(prompt_ids=prompt_ids, truncated=n_given - len(prompt_ids))
    chain = ChainHash(engine.lm.cfg["format_version"], engine.lm.model_sha256, prompt_ids)
    g.hash = chain.hex()
    if max_new_tokens == 0:
        g.stop = "length"
        return g
    n_total = min(engine.context_length, len(prompt_ids) + max_new_tokens)
    seq = engine.new_state(n_total)
    eos = {int(e) for e in eos_ids}
    history = list(prompt_ids) if sampler.penalized else None
    step = prefill_chunk if prefill_chunk > 0 else len(prompt_ids)
    for i in range(0, len(prompt_ids), step):
        logits = seq.forward(prompt_ids[i:i + step])[-1]
    while True:
        tok = sampler.pick(logits, seq.n_past, history)
        chain.update(logits, tok)
        g.tokens.append(tok)
        if history is not None:
            history.append(tok)
        stop_now = on_token(tok) if on_token is not None else False
        if tok in eos:
            g.stop = "eos"
        elif stop_now:
            g.stop = "stop"
        elif len(g.tokens) >= max_new_tokens:
            g.stop = "length"
        elif seq.n_past >= n_total:
            g.stop = "context"
        if g.stop:
            break
        logits = seq.forward([tok])[-1]
    g.hash = chain.hex()
    g.hashes = dict(chain.at)
    return g
