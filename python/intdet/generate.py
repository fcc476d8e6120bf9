"""Generation loop: prefill, decode, sampling, streaming and the chain hash."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .errors import IntdetError
from .hashing import ChainHash
from .model import Engine
from .sampling import Sampler
from .testhook import signal_at


@dataclass
class Generation:
    prompt_ids: list
    tokens: list = field(default_factory=list)
    hash: str = ""
    hashes: dict = field(default_factory=dict)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stop: str = ""  # "eos", "length" or "interrupted"

    def stats(self) -> dict:
        n_dec = max(len(self.tokens) - 1, 0)  # the first token comes from prefill
        return {
            "prompt_tokens": len(self.prompt_ids),
            "generated_tokens": len(self.tokens),
            "prefill_tok_s": len(self.prompt_ids) / self.prefill_s if self.prefill_s > 0 else None,
            "decode_tok_s": n_dec / self.decode_s if self.decode_s > 0 and n_dec else None,
            "hash": self.hash,
            "hashes": {str(k): v for k, v in sorted(self.hashes.items())},
            "stop": self.stop,
        }


def generate(engine: Engine, prompt_ids, max_new_tokens: int, sampler: Sampler | None = None,
             eos_ids=(), on_token=None, prefill_chunk: int = 0) -> Generation:
    """Prefill ``prompt_ids`` then decode up to ``max_new_tokens`` tokens.

    Stops after an id in ``eos_ids`` (which is kept and hashed) or after
    ``max_new_tokens``. ``on_token(id)`` is called as each token is chosen.
    ``prefill_chunk`` > 0 splits the prefill (the logits are identical).
    Raises IntdetError for an empty prompt or one that leaves no room in the
    context. KeyboardInterrupt stops generation and returns what was made
    (``stop == "interrupted"``).
    """
    sampler = sampler or Sampler()
    prompt_ids = [int(t) for t in prompt_ids]
    ctx = engine.context_length
    if not prompt_ids:
        raise IntdetError("prompt: empty (give some text or --ids)")
    if max_new_tokens < 0:
        raise IntdetError(f"-n: {max_new_tokens} must be >= 0")
    if len(prompt_ids) >= ctx:
        raise IntdetError(f"prompt: {len(prompt_ids)} tokens do not fit the context length {ctx} (leave room for one generated token)")
    bad = [t for t in prompt_ids if not 0 <= t < engine.vocab_size]
    if bad:
        raise IntdetError(f"--ids: token id {bad[0]} is outside the vocabulary [0, {engine.vocab_size})")
    g = Generation(prompt_ids=prompt_ids)
    chain = ChainHash(engine.lm.cfg["format_version"], engine.lm.model_sha256, prompt_ids)
    g.hash = chain.hex()
    n_total = min(ctx, len(prompt_ids) + max_new_tokens)
    if max_new_tokens == 0:
        g.stop = "length"
        return g
    seq = engine.new_sequence(n_total)
    eos = set(int(e) for e in eos_ids)
    try:
        t0 = time.perf_counter()
        step = prefill_chunk if prefill_chunk > 0 else len(prompt_ids)
        for i in range(0, len(prompt_ids), step):
            logits = seq.forward(prompt_ids[i:i + step])[-1]
        g.prefill_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        while True:
            tok = sampler.pick(logits, seq.n_past)
            chain.update(logits, tok)
            g.tokens.append(tok)
            if on_token:
                on_token(tok)
            signal_at(f"token-{len(g.tokens)}")  # test hook (testhook.py), inert unless its variable is set
            if tok in eos:
                g.stop = "eos"
                break
            if len(g.tokens) >= max_new_tokens or seq.n_past >= n_total:
                g.stop = "length"
                break
            logits = seq.forward([tok])[-1]
        g.decode_s = time.perf_counter() - t1
    except KeyboardInterrupt:
        g.stop = "interrupted"
    g.hash = chain.hex()
    g.hashes = dict(chain.at)
    return g
