"""Generation loop: prefill, decode, sampling, streaming and the chain hash."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .errors import IntdetError, check_token_ids
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
    stop: str = ""  # "eos", "length" (-n), "context" (the context is full), "stop" (a stop sequence) or "interrupted"
    truncated: int = 0  # prompt tokens cut by truncate="left"/"right"

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
            "truncated_prompt_tokens": self.truncated,
        }


PREFILL_CHUNK = 256  # prompt tokens per forward call: Ctrl-C is honoured between calls


def truncate_prompt(prompt_ids: list, ctx: int, max_new_tokens: int, side: str, bos_id=None) -> list:
    """Cut a prompt that does not fit the context to leave room for
    min(max_new_tokens, ctx // 2) generated tokens (at least one): "left"
    drops its beginning (keeping a leading BOS), "right" its end."""
    room = max(1, min(max_new_tokens, ctx // 2))
    keep = ctx - room
    if len(prompt_ids) <= keep:
        return prompt_ids
    if side == "right":
        return prompt_ids[:keep]
    if side != "left":
        raise IntdetError(f"--truncate: {side!r}: choose left or right")
    if bos_id is not None and prompt_ids and prompt_ids[0] == bos_id:
        return prompt_ids[:1] + prompt_ids[len(prompt_ids) - keep + 1:]
    return prompt_ids[len(prompt_ids) - keep:]


def check_prompt(prompt_ids, ctx: int, vocab_size: int, max_new_tokens: int, truncate: str | None = None,
                 bos_id=None) -> list:
    """The prompt ids ``intdet generate`` runs: checked (IntdetError naming
    the CLI's option for an empty prompt, a negative -n, an id outside the
    vocabulary, a prompt that leaves no room in the context) and cut by
    ``truncate`` "left"/"right" when too long (see :func:`truncate_prompt`)."""
    prompt_ids = [int(t) for t in prompt_ids]
    if not prompt_ids:
        raise IntdetError("prompt: empty (give some text or --ids)")
    if max_new_tokens < 0:
        raise IntdetError(f"-n: {max_new_tokens} must be >= 0")
    if truncate is not None and len(prompt_ids) >= ctx:
        prompt_ids = truncate_prompt(prompt_ids, ctx, max_new_tokens, truncate, bos_id)
    if len(prompt_ids) >= ctx:
        raise IntdetError(f"prompt: {len(prompt_ids)} tokens do not fit the context length {ctx} "
                          "(leave room for one generated token, or cut it with --truncate left|right)")
    check_token_ids(prompt_ids, vocab_size, "--ids")
    return prompt_ids


def generate(engine: Engine, prompt_ids, max_new_tokens: int, sampler: Sampler | None = None,
             eos_ids=(), on_token=None, prefill_chunk: int = PREFILL_CHUNK, on_prefill=None,
             truncate: str | None = None, bos_id=None) -> Generation:
    """Prefill ``prompt_ids`` then decode up to ``max_new_tokens`` tokens.

    Stops after an id in ``eos_ids`` (which is kept and hashed), after
    ``max_new_tokens``, at the end of the context, or when ``on_token(id)``
    (called as each token is chosen) returns True (``stop == "stop"``: the
    token is kept and hashed). The prefill runs in calls of ``prefill_chunk``
    tokens (0 = one call; the logits are identical for any split), calling
    ``on_prefill(done, total)`` after each. ``truncate`` "left"/"right" cuts a
    prompt that does not fit (see :func:`truncate_prompt`); None refuses it.
    Raises IntdetError for an empty prompt or one that leaves no room in the
    context. KeyboardInterrupt (between prefill calls or decode steps) stops
    generation and returns what was made (``stop == "interrupted"``).
    """
    sampler = sampler or Sampler()
    n_given = len(prompt_ids)
    prompt_ids = check_prompt(prompt_ids, engine.context_length, engine.vocab_size, max_new_tokens, truncate, bos_id)
    ctx = engine.context_length
    g = Generation(prompt_ids=prompt_ids, truncated=n_given - len(prompt_ids))
    chain = ChainHash(engine.lm.cfg["format_version"], engine.lm.model_sha256, prompt_ids)
    g.hash = chain.hex()
    n_total = min(ctx, len(prompt_ids) + max_new_tokens)
    if max_new_tokens == 0:
        g.stop = "length"
        return g
    seq = engine.new_sequence(n_total)
    eos = set(int(e) for e in eos_ids)
    history = list(prompt_ids) if sampler.penalized else None
    # On the CUDA engine, greedy or plain temperature sampling: the token is
    # chosen on the device and the next step is enqueued before this step's
    # logits are hashed (they arrive in pinned memory), so the GPU never
    # waits for the hash; the tokens and the chain hash are the host's.
    device = sampler.device_ok and seq.device_pick
    t1 = None  # decode start: set once the prompt is in
    try:
        t0 = time.perf_counter()
        step = prefill_chunk if prefill_chunk > 0 else len(prompt_ids)
        for i in range(0, len(prompt_ids), step):
            chunk = prompt_ids[i:i + step]
            if device and i + step >= len(prompt_ids):
                seq.submit_pick(chunk, sampler)
                tok, logits = seq.wait_pick()
            else:
                logits = seq.forward(chunk)[-1]
            if on_prefill:
                on_prefill(min(i + step, len(prompt_ids)), len(prompt_ids))
            signal_at(f"prefill-{i // step + 1}")  # test hook (testhook.py), inert unless its variable is set
        g.prefill_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        while True:
            if not device:
                tok = sampler.pick(logits, seq.n_past, history)
            at_end = seq.n_past >= n_total
            submitted = device and tok not in eos and len(g.tokens) + 1 < max_new_tokens and not at_end
            if submitted:
                seq.submit_pick(None, sampler)  # the next step runs on the device's token while the host hashes this one
            chain.update(logits, tok)
            g.tokens.append(tok)
            if history is not None:
                history.append(tok)
            stop_now = on_token(tok) if on_token else False
            signal_at(f"token-{len(g.tokens)}")  # test hook (testhook.py), inert unless its variable is set
            if tok in eos:
                g.stop = "eos"
            elif stop_now:
                g.stop = "stop"
            elif len(g.tokens) >= max_new_tokens:
                g.stop = "length"
            elif at_end:
                g.stop = "context"
            if g.stop:
                if submitted:
                    seq.wait_pick()  # the step enqueued ahead is not used
                break
            if device:
                tok, logits = seq.wait_pick()
            else:
                logits = seq.forward([tok])[-1]
        g.decode_s = time.perf_counter() - t1
    except KeyboardInterrupt:
        g.stop = "interrupted"
        if t1 is not None:  # during decode: the rate of the tokens made (interrupted in prefill: none, prefill_s 0)
            g.decode_s = time.perf_counter() - t1
    g.hash = chain.hex()
    g.hashes = dict(chain.at)
    return g


class TextStream:
    """Generated ids -> printable text, with stop sequences.

    ``push(id)`` returns (text now safe to print, stopped). Text that could
    be the start of a stop sequence is held back until it is known not to
    be; when a stop sequence appears (it may span tokens), the text before
    it is returned, ``stopped`` is True and the stop text itself is never
    returned. ``flush()`` returns what is still held (nothing after a stop).
    ``text`` is everything returned so far. Ids the tokenizer does not know
    (embedding rows padded past the vocabulary) have no text."""

    def __init__(self, tok, stop=(), skip_special_tokens: bool = True):
        from .tokenizer import StreamDecoder

        self._tok = tok
        self._dec = StreamDecoder(tok, skip_special_tokens=skip_special_tokens)
        self.stop = [s for s in stop if s]
        self._held = ""
        self.text = ""
        self.stopped = False

    def _emit(self, s: str) -> str:
        self.text += s
        return s

    def _feed(self, chunk: str) -> str:
        if self.stopped:
            return ""
        buf = self._held + chunk
        hits = [(buf.find(s), s) for s in self.stop if s in buf]
        if hits:
            at = min(h[0] for h in hits)
            self.stopped, self._held = True, ""
            return self._emit(buf[:at])
        # hold back the longest suffix of buf that is a proper prefix of a stop string
        keep = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if s.startswith(buf[len(buf) - k:]):
                    keep = k
                    break
        self._held = buf[len(buf) - keep:] if keep else ""
        return self._emit(buf[:len(buf) - keep])

    def push(self, token_id: int) -> tuple[str, bool]:
        if self.stopped or self._tok.id_to_token(int(token_id)) is None:
            return "", self.stopped
        out = self._feed(self._dec.push(token_id))
        return out, self.stopped

    def flush(self) -> str:
        if self.stopped:
            return ""
        out = self._feed(self._dec.flush())
        rest, self._held = self._held, ""
        return out + self._emit(rest) if not self.stopped else out
