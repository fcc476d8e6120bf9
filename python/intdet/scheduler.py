"""A deterministic continuous-batching scheduler over ``Engine.forward_batch``.

One engine loop admits requests as they come, runs the prefill chunks and
decode rows of many sequences in one forward call (``forward_batch`` is the
core's ``forward_rows``: each row's logits are the same bits whatever else is
in the call), samples each sequence with its own seeded integer sampler,
and retires sequences when they finish or are cancelled.

Why every request equals the same request run alone (``intdet generate``):
its logits do not depend on the batch or on how its prompt was cut into
chunks (the core's guarantee, tests/engine/test_batch.py), the sampler's draw is
keyed by (seed, absolute position), and the stop rules are those of the
plain reference loop of the tests (tests/oracle.py). Nothing here reads the
clock or the load to decide a token; the load only decides *when* a row runs.

A step (``Scheduler.step``):
  1. cancelled requests are retired;
  2. waiting requests are admitted first come, first served while fewer
     than ``max_batch`` run and their KV cache fits ``kv_bytes`` (a request
     reserves its whole KV cache at admission: (prompt + max_new_tokens)
     positions x ``kv_bytes_per_position``); the head of the queue is never
     overtaken, so no request starves;
  3. every decoding sequence contributes one row (with ``spec_tokens``,
     its last token and up to that many prompt-lookup drafts,
     speculate.py); prefilling sequences, shortest remaining prompt first
     (one passed over for PREFILL_PATIENCE steps first), take the rest of
     ``step_tokens`` (the token budget) in chunks; one
     forward_batch call runs them all (rows whose prompt log-probabilities
     are asked return the logits of every position);
  4. each sequence whose prompt is done picks its token, extends its chain
     hash and log-probabilities, and emits an ``Event``; with drafts, it
     picks again from the next row while the pick equals the draft, then
     drops the KV entries of the rejected drafts (the kept tokens are plain
     decoding's, bit for bit: speculate.py).

The device lane (CUDA): while one request runs alone and its sampler can
run on the GPU (greedy or temperature with top-k/top-p/min-p, no repetition
penalty, no grammar, no drafts), its next step is enqueued as soon as its
token is chosen, before the host hashes this step's logits and emits the
token (``State.submit_pick``: the forward of the chosen token and the
pick of the next one on the device, the logits copied to pinned memory).
The next ``step`` only waits for that pick (``wait_pick``) instead of
running a forward call, so the GPU never waits for the host. The tokens are
``Sampler.pick``'s (tests/engine/test_cuda.py); a request that stops early (a stop
string, a cancel) drops the step enqueued ahead; a second request joining
ends the lane at the next step.

Requests come from any thread (``submit``); ``step`` runs in one thread at a
time: the caller's (``run_until_idle``, as the Python API does) or the loop
thread of ``start`` (as the server does). Events are delivered by the
request's ``on_event(event)`` callback, called in the stepping thread; it
must not block (the server hands them to an asyncio queue).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .errors import IntdetError, check_token_ids
from .hashing import ChainHash
from .logprobs import LogSoftmax, to_float
from .sampling import Sampler
from .prefix_cache import PrefixCache
from .speculate import DraftState, ngram_drafts
from .testhook import stall_at

DEFAULT_MAX_BATCH = 16
DEFAULT_STEP_TOKENS = 512  # rows per forward call: decode rows + prefill chunks
DEFAULT_KV_BYTES = 2 << 30
CHOOSER_REFUSED = "the chooser found no token (impossible data)"  # a Request.chooser's id < 0
PREFILL_PATIENCE = 8  # steps a prompt may be passed over by shorter ones before it goes first


def _size(n: int) -> str:
    """Bytes as MiB, or as bytes under 1 MiB (so a small budget does not read '0 MiB')."""
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def kv_bytes_per_position(cfg: dict) -> int:
    """Bytes of KV cache one position takes: int8 K and V of every layer and
    KV head plus their int32 absmax scales (csrc/include/intdet/model.h
    KVCache)."""
    return cfg["num_layers"] * cfg["num_kv_heads"] * (2 * cfg["head_dim"] + 2 * 4)


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
        self.truncated = 0  # prompt tokens the API cut (SamplingParams.truncate)

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


class Scheduler:
    """The engine loop. ``max_batch``: sequences running at once;
    ``step_tokens``: rows per forward call (the token budget); ``kv_bytes``:
    KV cache memory the running sequences (and the prefix cache) may hold
    together; ``spec_tokens``: drafts per decode step (0: none; speculate.py),
    by prompt lookup, or by ``draft`` (a ``speculate.DraftModel``) when
    given; ``prefix_cache``: keep retired sequences' KV for prompts
    that start with the same tokens (prefix_cache.py; every backend).
    Raises IntdetError for a limit < 1 (spec_tokens < 0)."""

    def __init__(self, engine, max_batch: int = DEFAULT_MAX_BATCH, step_tokens: int = DEFAULT_STEP_TOKENS,
                 kv_bytes: int = DEFAULT_KV_BYTES, spec_tokens: int = 0, prefix_cache: bool = False,
                 draft=None):
        for name, v in (("max_batch", max_batch), ("step_tokens", step_tokens), ("kv_bytes", kv_bytes)):
            if not isinstance(v, int) or v < 1:
                raise IntdetError(f"{name}: {v!r} must be an integer >= 1", field=name)
        if not isinstance(spec_tokens, int) or isinstance(spec_tokens, bool) or not 0 <= spec_tokens <= 64:
            raise IntdetError(f"spec_tokens: {spec_tokens!r} must be an integer in [0, 64]", field="spec_tokens")
        self.spec_tokens = spec_tokens
        self.draft = draft
        self.cache = PrefixCache() if prefix_cache else None
        self.engine = engine
        self.max_batch = max_batch
        self.step_tokens = step_tokens
        self.kv_bytes = kv_bytes
        self.kv_per_pos = kv_bytes_per_position(engine.lm.cfg)
        if kv_bytes < 2 * self.kv_per_pos:  # a one-token prompt and one token: nothing smaller can run
            raise IntdetError(f"kv_bytes: {kv_bytes} bytes hold fewer than the 2 positions a request needs "
                              f"({self.kv_per_pos} bytes of KV cache each)", field="kv_bytes")
        self.kv_used = 0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread = None
        self._stopping = False
        self.steps = 0
        self.max_running_seen = 0
        self.spec_drafted = self.spec_accepted = 0  # over every request (speculative decoding)
        self._grammar_pool = None  # one worker computing structured-output masks beside the forward call
        self._exclusive: list = []  # (fn, Future): run with nothing running (exclusive())

    # ---------------------------------------------------------------- submit

    def check(self, req: Request) -> None:
        """IntdetError when ``req`` can never run: empty prompt, an id out of
        the vocabulary, no room in the context, or a KV cache larger than
        ``kv_bytes``."""
        ctx, vocab = self.engine.context_length, self.engine.vocab_size
        if not req.prompt_ids:
            raise IntdetError("prompt: empty", field="prompt")
        check_token_ids(req.prompt_ids, vocab, "prompt")
        if req.max_new_tokens < 0:
            raise IntdetError(f"max_tokens: {req.max_new_tokens} must be >= 0", field="max_tokens")
        if len(req.prompt_ids) > ctx or (len(req.prompt_ids) == ctx and req.max_new_tokens > 0):
            raise IntdetError(f"prompt: {len(req.prompt_ids)} tokens do not fit the context length {ctx} "
                              "(leave room for one generated token)", field="prompt")
        if not 1 <= req.score_from <= len(req.prompt_ids):
            raise IntdetError(f"score_from: {req.score_from} must be in [1, {len(req.prompt_ids)}]", field="score_from")
        need = self._positions(req) * self.kv_per_pos
        if need > self.kv_bytes:
            raise IntdetError(f"max_tokens: the prompt and max_tokens need {self._positions(req)} positions, "
                              f"{_size(need)} of KV cache, more than the budget of {_size(self.kv_bytes)} "
                              "(kv_bytes; intdet serve --kv-cache-mib)", field="max_tokens")

    def _positions(self, req: Request) -> int:
        return min(self.engine.context_length, len(req.prompt_ids) + req.max_new_tokens)

    def submit(self, req: Request) -> Request:
        """Queue ``req`` (checked first: IntdetError when it can never run)."""
        self.check(req)
        req.t_submit = time.perf_counter()
        with self._lock:
            if self._stopping:
                raise IntdetError("the server is shutting down")
            self.waiting.append(req)
            self._wake.notify()
        return req

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self.waiting and not self.running

    # ---------------------------------------------------------------- the step

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

    def _admit(self) -> None:
        with self._lock:
            gone = [r for r in self.waiting if r._cancel]
            if gone:
                self.waiting = deque(r for r in self.waiting if not r._cancel)
            while self.waiting and len(self.running) < self.max_batch and not self._exclusive:
                req = self.waiting[0]
                need = self._positions(req) * self.kv_per_pos
                while self.cache is not None and self.kv_used + self.cache.bytes + need > self.kv_bytes and self.cache:
                    self.cache.evict_oldest()  # cached prefixes give way to requests
                if self.kv_used + need > self.kv_bytes:
                    break  # queued, not failed: it runs when a sequence retires
                self.waiting.popleft()
                self.kv_used += need
                self._start(req)
                self.running.append(req)
            self.max_running_seen = max(self.max_running_seen, len(self.running))
        for r in gone:
            self._drop_waiting(r)

    def _drop_waiting(self, req: Request) -> None:
        req.finish_reason = "cancelled"
        req.t_done = time.perf_counter()
        self._emit(req, Event("done", req))
        req.done.set()

    def _start(self, req: Request) -> None:
        from .generate import TextStream

        req._n_total = self._positions(req)
        req.t_start = time.perf_counter()
        req.model_version = self.engine.lm.model_sha256  # the weights it runs on (exclusive() swaps between)
        if req.max_new_tokens > 0 or req.needs_all_logits:
            req._seq = self.engine.new_state(req._n_total)
        req._chain = ChainHash(self.engine.lm.cfg["format_version"], self.engine.lm.model_sha256,
                               req.prompt_ids[:req.score_from])
        req._history = list(req.prompt_ids) if req.sampler.penalized else None
        if req.tokenizer is not None:
            req._stream = TextStream(req.tokenizer, req.stop)
        if req.prompt_logprobs is not None:
            req.prompt_token_logprobs = [None]
        if self.spec_tokens and req._seq is not None and req.chooser is None:
            req._draft = DraftState(self.spec_tokens)
        # the prefix cache is looked up when the prompt's first chunk is
        # planned (_lookup), so a request admitted with others can use the
        # prompt of one whose prefill ran before its own
        req._looked_up = not (self.cache is not None and req._seq is not None and not req.needs_all_logits
                              and req._seq.can_copy_prefix)

    def _shares_a_pending_prompt(self, req: Request, running) -> bool:
        """Whether an earlier-admitted request still prefilling has a prompt
        that starts with at least the cache's min_tokens of req's."""
        n = self.cache.min_tokens
        head = req.prompt_ids[:n]
        for o in running:
            if o is req:
                return False
            if o._looked_up and o._seq is not None and o._prefilled < len(o.prompt_ids) and o.prompt_ids[:n] == head:
                return True
        return False

    def _lookup(self, req: Request) -> None:
        """Start req's prefill from the longest cached prefix of its prompt."""
        req._looked_up = True
        hit, m = self.cache.lookup(req.prompt_ids)
        if hit is not None:
            req._seq.copy_prefix(hit.seq, m)  # those positions' KV, bit for bit what a prefill writes
            req._prefilled = req.cached_tokens = m

    def step(self) -> bool:
        """Run one forward call for the running sequences (admitting and
        retiring around it). Returns False when there was nothing to do."""
        with self._lock:
            cancelled = [r for r in self.running if r._cancel]
        for r in cancelled:
            self._retire(r, "cancelled")
        self._admit()
        with self._lock:
            running = list(self.running)
        for r in running:  # max_new_tokens 0 and no prompt log-probabilities: nothing to run
            if r._seq is None:
                self._retire(r, "length")
        lane = [r for r in running if r._pending]
        for r in lane:  # the device lane: the step enqueued last time; its pick may enqueue the next
            r._pending = False
            tok, logits = r._seq.wait_pick()
            self._take(r, logits, r._seq.n_past, tok)
        running = [r for r in running if r._seq is not None and not r._pending]
        if not running:
            if lane:
                self.steps += 1
            return bool(lane)
        # rows: every decoding sequence one, then prefill chunks
        plan = []
        budget = self.step_tokens
        for r in running:
            if r._prefilled == len(r.prompt_ids):
                r._drafts = self._propose(r, budget - 1) if r._draft is not None else []
                plan.append((r, [r.tokens[-1]] + r._drafts))
                budget -= 1 + len(r._drafts)
        prefilling = [r for r in running if r._prefilled < len(r.prompt_ids)]
        for r in prefilling:  # in admission order
            if not r._looked_up and not self._shares_a_pending_prompt(r, running):
                self._lookup(r)  # (one sharing an earlier prompt's start waits to copy it when done)
        # the shortest remaining prompts first, so a prefix-cache hit's few
        # tokens do not wait behind a long prompt's chunks; a prompt passed
        # over for PREFILL_PATIENCE steps goes first (no starvation); ties
        # in admission order. The order changes when a row runs, never a bit.
        for r in sorted((r for r in prefilling if r._looked_up),
                        key=lambda r: (r._passed_over < PREFILL_PATIENCE, len(r.prompt_ids) - r._prefilled)):
            if budget <= 0:
                r._passed_over += 1
                continue
            n = min(budget, len(r.prompt_ids) - r._prefilled)
            plan.append((r, r.prompt_ids[r._prefilled:r._prefilled + n]))
            budget -= n
            r._passed_over = 0
        # rows of prompts whose every position's logits are needed (prompt
        # log-probabilities, scoring) and decode rows with drafts return all
        # their logits; the rest only the last
        flags = [(r.needs_all_logits and r._prefilled < len(r.prompt_ids))
                 or (r._prefilled == len(r.prompt_ids) and len(t) > 1) for r, t in plan]
        if not plan:
            return False
        masks = self._prefetch_masks(plan)
        stall_at(f"engine-step-{self.steps + 1}")  # test hook (testhook.py), inert unless its variable is set
        try:
            outs = self.engine.forward_batch([r._seq for r, _ in plan], [t for _, t in plan], all_logits=flags)
        except Exception as e:  # noqa: BLE001  (inputs were checked; keep serving the others)
            for r, _ in plan:
                self._retire(r, "error", f"engine: {e}")
        else:
            if masks is not None:
                masks.result()
            for (r, toks), out, all_logits in zip(plan, outs, flags):
                self._after_forward(r, toks, out, all_logits)
        self.steps += 1
        self._choose([r for r, _ in plan if r.chooser is not None and r._seq is not None and r._logits is not None])
        for r, _ in plan:
            if r._seq is not None and r._logits is not None and not r._cancel:
                self._advance(r)
        return True

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

    def _prefetch_masks(self, plan):
        """Start computing the structured-output masks of this step's first
        picks in a worker thread (the grammar states cannot change before
        the forward returns), so the forward hides their cost; the future,
        or None when no request in the plan has a grammar."""
        states = [r._grammar for r, _ in plan if r._grammar is not None]
        if not states:
            return None
        if self._grammar_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._grammar_pool = ThreadPoolExecutor(1, thread_name_prefix="intdet-grammar")
        return self._grammar_pool.submit(lambda: [g.prefetch() for g in states])

    def _after_forward(self, r: Request, toks, out, all_logits: bool) -> None:
        if r._prefilled < len(r.prompt_ids):
            start = r._prefilled
            r._prefilled += len(toks)
            if all_logits:
                self._prompt_rows(r, start, out)
            if r.on_prefill is not None:
                try:
                    r.on_prefill(r._prefilled, len(r.prompt_ids))
                except Exception:  # a consumer's bug must not stop the engine loop
                    r._cancel = True
            if r._prefilled < len(r.prompt_ids):
                return  # more prompt chunks to come
            if self.cache is not None and r._seq.can_copy_prefix:
                self.cache.insert_live(r.prompt_ids, r._seq)  # its prompt's KV, for the prompts planned after it
            if r.max_new_tokens == 0:
                self._retire(r, "length")
                return
            r._logits = out[-1:]
            return
        r._logits = out  # the last token's row, then one per draft

    def _propose(self, r: Request, room: int) -> list:
        """This step's drafts for decoding request r: within the step's
        budget (room), the tokens it may still make after the next one, and
        its KV cache."""
        k = min(r._draft.want(), room, r.max_new_tokens - len(r.tokens) - 1, r._n_total - r._seq.n_past - 1)
        if k < 1:
            return []
        if self.draft is not None:
            if r._draft_seq is None:
                r._draft_seq = self.draft.new_seq(r._n_total)
            return self.draft.propose(r._draft_seq, r.prompt_ids + r.tokens, k)
        return ngram_drafts(r.prompt_ids + r.tokens, k)

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

    # ---------------------------------------------------------------- driving

    def run_until_idle(self, until=None) -> None:
        """Step in the calling thread until nothing waits or runs (or
        ``until()`` is true). Not with ``start``'s thread running."""
        if self._thread is not None:
            raise RuntimeError("run_until_idle: the scheduler's loop thread is running")
        while not (until and until()):
            if not self.step() and self.idle:
                break

    def start(self) -> None:
        """Run the engine loop in a daemon thread (the server's mode)."""
        if self._thread is not None:
            return
        # the core's thread count is one process-wide setting (auto included),
        # so the loop thread runs with the caller's
        self._thread = threading.Thread(target=self._loop, name="intdet-engine", daemon=True)
        self._thread.start()

    def exclusive(self, fn, timeout: float | None = None):
        """Run ``fn()`` with no request running and return its result (or
        raise its exception): admission pauses, the running requests finish
        (on what they started with), ``fn`` runs (in the loop thread when
        ``start`` runs one, else here), then the waiting ones are admitted.
        LLM.update_weights swaps the weights this way. Without a loop
        thread, requests still running (a stream not read to its end) are
        an IntdetError. TimeoutError after ``timeout`` seconds (``fn`` then
        still runs when its turn comes)."""
        from concurrent.futures import Future

        if self._thread is None:
            with self._lock:
                busy = bool(self.running)
            if busy:
                raise IntdetError("requests are running (a stream not read to its end): finish or close them first")
            return fn()
        fut: Future = Future()
        with self._lock:
            if self._stopping:
                raise IntdetError("the server is shutting down")
            self._exclusive.append((fn, fut))
            self._wake.notify_all()
        return fut.result(timeout)

    def _run_exclusive(self) -> None:
        with self._lock:
            if not self._exclusive or self.running:
                return
            fn, fut = self._exclusive.pop(0)
        if fut.set_running_or_notify_cancel():
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001  (handed to the caller)
                fut.set_exception(e)

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self.waiting and not self.running and not self._stopping and not self._exclusive:
                    self._wake.wait()
                if self._stopping and not self.running and not self.waiting:
                    for _, fut in self._exclusive:
                        fut.cancel()
                    return
            self._run_exclusive()
            try:
                self.step()
            except Exception as e:  # noqa: BLE001  (a bug here must not leave clients waiting forever)
                with self._lock:
                    stuck = list(self.running)
                for r in stuck:
                    try:
                        self._retire(r, "error", f"engine loop: {type(e).__name__}: {e}")
                    except Exception:  # noqa: BLE001  (drop it by hand: it must not come back every step)
                        with self._lock:
                            if r in self.running:
                                self.running.remove(r)
                                self.kv_used -= self._positions(r) * self.kv_per_pos
                        r.finish_reason, r._seq = "error", None
                        r.done.set()

    def cancel_all(self) -> None:
        """Stop taking requests and cancel every waiting and running one
        without waiting (any thread): the loop retires them at its next
        step, each with finish_reason "cancelled"."""
        with self._lock:
            self._stopping = True
            reqs = list(self.waiting) + list(self.running)
            self._wake.notify_all()
        for r in reqs:
            r.cancel()

    def shutdown(self, cancel: bool = True, timeout: float | None = None) -> None:
        """Stop taking requests; ``cancel``: retire every running and waiting
        request as cancelled, else let them finish. Joins the loop thread."""
        with self._lock:
            self._stopping = True
            reqs = list(self.waiting) + list(self.running)
            self._wake.notify_all()
        if cancel:
            for r in reqs:
                r.cancel()
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._thread = None

    @property
    def busy(self) -> bool:
        """Whether the loop thread is still running (after a ``shutdown``
        whose timeout ended first: a forward call in flight)."""
        return self._thread is not None and self._thread.is_alive()
