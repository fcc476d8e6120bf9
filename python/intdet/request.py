"""Requests: what one sequence asks for (``Request``), what its consumer
receives (``Event``, ``TokenLogprob``), and the checks of a request.

A Request holds its parameters, its results and the per-sequence state the
scheduler (scheduler.py) keeps while it runs; nothing here runs the model.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from .errors import IntdetError, check_token_ids
from .logprobs import to_float
from .sampling import Sampler


@dataclass
class TokenLogprob:
    """One position's log-probabilities, Q24 nats (logprobs.py): ``token``
    and its ``logprob_q`` (the model's: raw logits); ``top``: [(id,
    logprob_q)] most likely first; ``behaviour_logprob_q``: for a generated
    token, its log-probability under the distribution the sampler drew it
    from (temperature, top-k/p, min-p, repetition penalty, grammar mask:
    ``Sampler.behaviour_logprob_q``; 0 when greedy), else None."""

    token: int
    logprob_q: int
    top: list = field(default_factory=list)
    behaviour_logprob_q: int | None = None

    @property
    def logprob(self) -> float:
        """The exact float value logprob_q / 2^24."""
        return to_float(self.logprob_q)

    @property
    def behaviour_logprob(self) -> float | None:
        """The exact float value behaviour_logprob_q / 2^24 (None when not known)."""
        return None if self.behaviour_logprob_q is None else to_float(self.behaviour_logprob_q)


@dataclass
class Event:
    """What a request's ``on_event`` receives.

    kind "token": one generated ``token`` (id), the ``text`` now safe to show
    (stop sequences held back), its ``logprob`` (TokenLogprob or None) and
    ``chain_state``: the chain hash's state after it (hashing.ChainHash
    .state, 16 bytes), so a consumer can name the hash of the tokens it has
    received without reading the engine's state (the server's drain).
    kind "done": the request finished; ``request`` holds the result
    (tokens, text, finish_reason, hash, log-probabilities). kind "error":
    the engine failed on this request (``error``: message); it is retired."""

    kind: str
    request: "Request"
    token: int | None = None
    text: str = ""
    logprob: TokenLogprob | None = None
    error: str = ""
    chain_state: bytes | None = None


_ids = itertools.count()


class Request:
    """One sequence to run.

    Args:
        prompt_ids: int token ids (non-empty, each in [0, vocab)).
        max_new_tokens: most tokens to generate (>= 0).
        sampler: a ``Sampler`` (greedy by default); its seed keys the draws.
        eos_ids: ids that end the generation (kept and hashed).
        stop: stop strings: the generation ends when its text contains one
            (the token completing it is kept and hashed; the text before it
            is the result, as ``intdet generate --stop``).
        logprobs: None, or k >= 0: each generated token's log-probability
            and the k most likely alternatives.
        prompt_logprobs: None, or k >= 0: the same for every prompt position
            after the first (the log-likelihood an evaluation harness reads).
        score_from: prompt positions >= score_from are a continuation being
            scored: the chain hash starts from prompt_ids[:score_from] and
            hashes each of those tokens with the logits that predicted it
            (as if generated), then goes on with the generated tokens.
            Default: len(prompt_ids) (the hash of ``intdet generate``).
        on_event: callable(Event) or None.
        step_hashes: keep the chain hash after every generated token in
            ``step_hashes`` (hash-check's divergence report).
        on_prefill: callable(done, total) or None, called in the stepping
            thread after each prefill chunk (``done`` prompt positions of
            ``total`` have run); an exception from it cancels the request,
            except KeyboardInterrupt, which propagates (Ctrl-C in the CLI).
        tokenizer: for the text and stop strings (None: no text).
        grammar: None, or a ``structured.Grammar``: each token is picked
            over the ids it allows (the chain hash and log-probabilities
            still see the unmasked logits); the generation ends ("stop")
            when the grammar can take nothing more.
        chooser: None, or an object choosing each token instead of the
            sampler (decompression's range decoder, compress/codec.py): the
            scheduler calls ``type(chooser).choose_rows(choosers, rows)``
            once per step for every request with a chooser of that class
            (rows: each one's int32 logits row, V values) and takes the
            returned ids; an id < 0 retires the request with an error.
            Such a request gets no drafts; give it no eos_ids or stop to
            run max_new_tokens tokens.
    """

    def __init__(self, prompt_ids, max_new_tokens: int, sampler: Sampler | None = None, eos_ids=(), stop=(),
                 logprobs: int | None = None, prompt_logprobs: int | None = None, score_from: int | None = None,
                 on_event=None, tokenizer=None, on_prefill=None, grammar=None, step_hashes: bool = False,
                 chooser=None):
        self.id = next(_ids)
        self.prompt_ids = [int(t) for t in prompt_ids]
        self.max_new_tokens = int(max_new_tokens)
        self.sampler = sampler or Sampler()
        self.eos_ids = frozenset(int(e) for e in eos_ids)
        self.stop = tuple(s for s in stop if s)
        self.logprobs = logprobs
        self.prompt_logprobs = prompt_logprobs
        self.score_from = len(self.prompt_ids) if score_from is None else int(score_from)
        self.on_event = on_event
        self.on_prefill = on_prefill
        self.tokenizer = tokenizer
        self._grammar = grammar.matcher() if grammar is not None else None  # built here, in the caller's thread
        self.chooser = chooser
        # results
        self.tokens: list[int] = []
        self.token_logprobs: list[TokenLogprob] = []
        self.prompt_token_logprobs: list[TokenLogprob | None] = []  # [None] + one per prompt position > 0
        self.text = ""
        self.finish_reason = ""  # eos, stop, length, context, cancelled, error
        self.error = ""
        self.hash = ""
        self.hashes: dict = {}
        self.step_hashes: list | None = [] if step_hashes else None
        self.done = threading.Event()
        self.t_submit = self.t_start = self.t_first = self.t_done = 0.0  # t_start: admitted
        # engine state (the scheduler's)
        self._cancel = False
        self._seq = None
        self._prefilled = 0
        self._chain = None
        self._stream = None
        self._history = None
        self._n_total = 0
        self._logits = None  # the logits rows the next tokens are picked from
        self._looked_up = True  # prefix cache: looked up (or not to be)
        self._draft = None  # speculate.DraftState with speculative decoding
        self._draft_seq = None  # speculate.DraftSeq with a draft model
        self._drafts: list = []  # this step's drafts (fed after the last token)
        self._passed_over = 0  # consecutive steps this prompt's prefill got no rows
        self._pending = False  # the device lane: a step enqueued on the GPU (submit_pick), not yet waited for
        self._chosen: int | None = None  # this step's token from the chooser
        self.cached_tokens = 0  # prompt positions taken from the prefix cache (not computed)
        self.model_version = ""  # the model's sha256 when admitted (LLM.update_weights changes it)
        self.receipt_head: dict | None = None  # LLM.request's start of the receipt (receipts.head), when asked
        self.truncated = 0  # prompt tokens the API cut (SamplingParams.truncate)
        self._checked_by = None  # the Scheduler whose check it passed (its submit does not check again)

    @property
    def chain_hash(self) -> str:
        """The whole chain hash (32 hex digits; ``hash`` is its first 12)
        after the tokens made so far, "" before the request starts."""
        return self._chain.state.hex() if self._chain is not None else ""

    @property
    def spec_drafted(self) -> int:
        """Draft tokens proposed for this request (speculative decoding)."""
        return self._draft.drafted if self._draft else 0

    @property
    def spec_accepted(self) -> int:
        """Draft tokens kept (each one saved a forward call's row of its own)."""
        return self._draft.accepted if self._draft else 0

    @property
    def stop_string(self) -> str | None:
        """The stop sequence that ended this request (finish_reason "stop"
        by a stop string), else None (vLLM's ``stop_reason``)."""
        return self._stream.stop_string if self._stream is not None else None

    def cancel(self) -> None:
        """Ask the scheduler to retire this request at its next step (its
        client went away); thread-safe, idempotent."""
        self._cancel = True

    @property
    def needs_all_logits(self) -> bool:
        return self.prompt_logprobs is not None or self.score_from < len(self.prompt_ids)

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


def _size(n: int) -> str:
    """Bytes as MiB, or as bytes under 1 MiB (so a small budget does not read '0 MiB')."""
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def check_request(req: Request, context_length: int, vocab_size: int, kv_per_pos: int, kv_bytes: int,
                  ids_checked: bool = False) -> None:
    """The checks of a request (the one path: ``Scheduler.check`` runs it
    once, for whoever builds the Request). IntdetError, naming the field,
    when ``req`` can never run: empty prompt, an id outside [0,
    ``vocab_size``) (not scanned when ``ids_checked``: the caller checked
    them under its own field's name), max_new_tokens < 0, no room in
    ``context_length``, score_from out of range, or a KV cache (positions x
    ``kv_per_pos`` bytes) larger than ``kv_bytes``."""
    ctx = context_length
    if not req.prompt_ids:
        raise IntdetError("prompt: empty", field="prompt")
    if not ids_checked:
        check_token_ids(req.prompt_ids, vocab_size, "prompt")
    if req.max_new_tokens < 0:
        raise IntdetError(f"max_tokens: {req.max_new_tokens} must be >= 0", field="max_tokens")
    if len(req.prompt_ids) > ctx or (len(req.prompt_ids) == ctx and req.max_new_tokens > 0):
        raise IntdetError(f"prompt: {len(req.prompt_ids)} tokens do not fit the context length {ctx} "
                          "(leave room for one generated token)", field="prompt")
    if not 1 <= req.score_from <= len(req.prompt_ids):
        raise IntdetError(f"score_from: {req.score_from} must be in [1, {len(req.prompt_ids)}]", field="score_from")
    positions = min(ctx, len(req.prompt_ids) + req.max_new_tokens)  # Scheduler._positions
    need = positions * kv_per_pos
    if need > kv_bytes:
        raise IntdetError(f"max_tokens: the prompt and max_tokens need {positions} positions, "
                          f"{_size(need)} of KV cache, more than the budget of {_size(kv_bytes)} "
                          "(kv_bytes; intdet serve --kv-cache-mib)", field="max_tokens")
