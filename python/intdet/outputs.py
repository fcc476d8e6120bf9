"""Outputs and stop checks: taking a step's tokens from its logits rows,
the stop rules, retiring a request and emitting its events.

``Outputs`` is the half of the ``Scheduler`` (scheduler.py) that runs after
a forward call: for each sequence, pick its token (the sampler, a grammar,
a chooser, or the device lane's pick), extend its chain hash and
log-probabilities, emit an ``Event``, and retire it when a stop rule fires
(eos, a stop string, the grammar's end, max_new_tokens, the context) or it
is cancelled or fails. The Scheduler owns the state these methods read
(``running``, ``kv_used``, ``cache``, ``_lock`` ...).
"""

from __future__ import annotations

import time

import numpy as np

from .errors import IntdetError
from .logprobs import LogSoftmax
from .request import Event, Request, TokenLogprob

CHOOSER_REFUSED = "the chooser found no token (impossible data)"  # a Request.chooser's id < 0


class Outputs:
    """The Scheduler's outputs and stop checks (module docstring)."""

    def _emit(self, req: Request, ev: Event) -> None:
        if req.on_event is not None:
            try:
                req.on_event(ev)
            except Exception:  # a consumer's bug must not stop the engine loop
                req._cancel = True

    def _retire(self, req: Request, reason: str, error: str = "") -> None:
        # held-back text (a stop string's possible start, an incomplete UTF-8
        # character) belongs to the tokens made, also when the client cancels
        if req._stream is not None and reason not in ("stop", "error"):
            tail = req._stream.flush()
            if tail:
                req.text = req._stream.text
                self._emit(req, Event("token", req, text=tail))  # held-back text, no new token
        if req._stream is not None:
            req.text = req._stream.text
        req.finish_reason, req.error = reason, error
        if req._chain is not None:
            req.hash, req.hashes = req._chain.hex(), dict(req._chain.at)
        seq = req._seq
        if req._pending:  # the step the device lane enqueued ahead is not used
            seq.wait_pick()
            req._pending = False
        req._seq = req._logits = req._draft_seq = None  # frees the KV caches, or hands one to the prefix cache
        self.kv_used -= self._positions(req) * self.kv_per_pos
        if self.cache is not None and seq is not None:
            self.cache.drop_live(seq)
            if reason != "error" and seq.can_copy_prefix:
                self.cache.insert((req.prompt_ids + req.tokens)[:seq.n_past], seq, self._positions(req) * self.kv_per_pos)
        req.t_done = time.perf_counter()
        with self._lock:
            if req in self.running:
                self.running.remove(req)
        self._emit(req, Event("error" if reason == "error" else "done", req, error=error))
        req.done.set()

    def _drop_waiting(self, req: Request) -> None:
        req.finish_reason = "cancelled"
        req.t_done = time.perf_counter()
        self._emit(req, Event("done", req))
        req.done.set()

    @staticmethod
    def _choose(reqs) -> None:
        """The choosers' tokens for this step, one call per chooser class
        (a batch of range decoders runs in parallel in C++)."""
        by_class: dict = {}
        for r in reqs:
            by_class.setdefault(type(r.chooser), []).append(r)
        for cls, group in by_class.items():
            toks = cls.choose_rows([r.chooser for r in group], [r._logits[0] for r in group])
            for r, t in zip(group, toks):
                r._chosen = int(t)

    def _prompt_rows(self, r: Request, start: int, out) -> None:
        """Rows of prompt positions start..start+len(out)-1: the log-probability
        of the next prompt token, and the scored continuation's hash."""
        n = len(r.prompt_ids)
        last = min(start + len(out), n - 1)  # row p predicts prompt token p + 1
        if last <= start:
            return
        rows = out[:last - start]
        if r.prompt_logprobs is not None:
            ls = LogSoftmax(rows)
            for j in range(len(rows)):
                tok = r.prompt_ids[start + j + 1]
                r.prompt_token_logprobs.append(TokenLogprob(tok, ls.logprob_q(j, tok), ls.top(j, r.prompt_logprobs)))
        for j in range(len(rows)):
            p = start + j
            if p >= r.score_from - 1:
                r._chain.update(rows[j], r.prompt_ids[p + 1])

    def _advance(self, r: Request) -> None:
        """Pick the next token(s) from r._logits: the last token's row, then,
        while each pick equals this step's draft, the draft's row; then drop
        the KV entries of the drafts not kept."""
        rows, r._logits = r._logits, None
        drafts, r._drafts = r._drafts, []
        base = r._seq.n_past - len(rows) + 1  # positions cached after row 0 in plain decoding
        kept = 0
        for i in range(len(rows)):
            tok = self._take(r, rows[i], base + i)
            if r._seq is None:  # retired (eos, stop, length, context)
                break
            if i < len(drafts) and tok == drafts[i]:
                kept += 1
                continue
            if r._seq.n_past > base + i and not r._pending:
                r._seq.truncate(base + i)  # the rejected drafts' KV entries
            break
        if drafts:
            r._draft.record(len(drafts), kept)
            self.spec_drafted += len(drafts)
            self.spec_accepted += kept

    def _take(self, r: Request, logits, n_past: int, tok: int | None = None) -> int:
        """Pick one token from logits (the row plain decoding has when n_past
        positions are cached; ``tok``: the token the device lane chose from
        it) and apply the stop rules."""
        on_device = tok is not None  # chosen by the device lane: the GPU holds it for the next step
        behaviour = None  # the chosen token's behaviour log-probability, when log-probabilities are asked
        if r.chooser is not None:
            tok, r._chosen = r._chosen, None
            if tok is None or tok < 0:
                self._retire(r, "error", CHOOSER_REFUSED)
                return -1
        elif tok is None:
            try:
                allowed = r._grammar.allowed() if r._grammar is not None else None
                if r.logprobs is not None:
                    tok, behaviour = r.sampler.pick_logprob(logits, n_past, r._history, allowed)
                else:
                    tok = r.sampler.pick(logits, n_past, r._history, allowed)
                if r._grammar is not None:
                    r._grammar.advance(tok)
            except IntdetError as e:
                self._retire(r, "error", str(e))
                return -1
        elif r.logprobs is not None:  # the device lane's pick (no grammar there): the same distribution
            behaviour = r.sampler.behaviour_logprob_q(logits, tok, r._history)
        if (tok not in r.eos_ids and len(r.tokens) + 1 < r.max_new_tokens and r._seq.n_past < r._n_total
                and self._device_lane(r)):
            if not on_device:  # forward_batch's rows may live in the pinned buffer the submit writes
                logits = np.array(logits)
            # the next step runs on the GPU while the host hashes this one
            r._seq.submit_pick(None if on_device else [tok], r.sampler)
            r._pending = True
        r._chain.update(logits, tok)  # the unmasked logits: the model's (docs/chain-hash.md)
        if r.step_hashes is not None:
            r.step_hashes.append(r._chain.hex())
        r.tokens.append(tok)
        if not r.t_first:
            r.t_first = time.perf_counter()
        if r._history is not None:
            r._history.append(tok)
        lp = None
        if r.logprobs is not None:
            ls = LogSoftmax(logits)
            lp = TokenLogprob(tok, ls.logprob_q(0, tok), ls.top(0, r.logprobs), behaviour)
            r.token_logprobs.append(lp)
        piece, stopped = r._stream.push(tok) if r._stream is not None else ("", False)
        if r._stream is not None:
            r.text = r._stream.text
        self._emit(r, Event("token", r, token=tok, text=piece, logprob=lp, chain_state=r._chain.state))
        if tok in r.eos_ids:
            self._retire(r, "eos")
        elif stopped or (r._grammar is not None and r._grammar.done):
            self._retire(r, "stop")
        elif len(r.tokens) >= r.max_new_tokens:
            self._retire(r, "length")
        elif n_past >= r._n_total:
            self._retire(r, "context")
        return tok

    def _device_lane(self, r: Request) -> bool:
        """Whether r's next token may be chosen on the device, enqueued now
        (the module docstring's device lane)."""
        return (r._seq.device_pick and r.sampler.device_ok and r._grammar is None and r._draft is None
                and r.chooser is None
                and not r._cancel and len(self.running) == 1 and not self.waiting)
