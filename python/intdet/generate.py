"""What generation needs beside its loop: the prompt checks and truncation
of ``intdet generate``, its stats (``Generation``), and the streamed text
with stop strings (``TextStream``). The loop itself is the scheduler's step
(scheduler.py), the one loop of the CLI, chat, hash-check, the Python API,
the server, batch jobs and decompression."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import IntdetError, check_token_ids


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
        raise IntdetError(f"truncate: {side!r}: choose left or right", field="truncate")
    if bos_id is not None and prompt_ids and prompt_ids[0] == bos_id:
        return prompt_ids[:1] + prompt_ids[len(prompt_ids) - keep + 1:]
    return prompt_ids[len(prompt_ids) - keep:]


def check_prompt(prompt_ids, ctx: int, vocab_size: int, max_new_tokens: int, truncate: str | None = None,
                 bos_id=None) -> list:
    """The prompt ids ``intdet generate`` runs: checked (IntdetError naming
    the field for an empty prompt, a negative -n, an id outside the
    vocabulary, a prompt that leaves no room in the context) and cut by
    ``truncate`` "left"/"right" when too long (see :func:`truncate_prompt`)."""
    prompt_ids = [int(t) for t in prompt_ids]
    if not prompt_ids:
        raise IntdetError("prompt: empty (give some text or --ids)")
    if max_new_tokens < 0:
        raise IntdetError(f"max_tokens: {max_new_tokens} must be >= 0", field="max_tokens")
    if truncate is not None and len(prompt_ids) >= ctx:
        prompt_ids = truncate_prompt(prompt_ids, ctx, max_new_tokens, truncate, bos_id)
    if len(prompt_ids) >= ctx:
        raise IntdetError(f"prompt: {len(prompt_ids)} tokens do not fit the context length {ctx} "
                          "(leave room for one generated token, or cut it with --truncate left|right)")
    check_token_ids(prompt_ids, vocab_size, "ids")
    return prompt_ids


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
        self.stop_string: str | None = None  # the stop sequence that ended the text

    def _emit(self, s: str) -> str:
        self.text += s
        return s

    def _feed(self, chunk: str) -> str:
        if self.stopped:
            return ""
        buf = self._held + chunk
        hits = [(buf.find(s), s) for s in self.stop if s in buf]
        if hits:
            at, self.stop_string = min(hits, key=lambda h: h[0])  # the earliest; ties: the first listed
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
