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

The cut (as vLLM v1 cuts its scheduler): request.py holds the requests and
their checks (``Request``, ``Event``, ``TokenLogprob``, ``check_request``);
this module plans and steps (admission, the step plan, the forward calls,
the driving loop and threads); outputs.py takes the step's outputs (picking
tokens, the stop rules, retiring, emitting events) as ``Outputs``, which
``Scheduler`` inherits. The moved names are importable from here too.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from .errors import IntdetError
from .hashing import ChainHash
from .outputs import CHOOSER_REFUSED, Outputs
from .prefix_cache import PrefixCache
from .request import Event, Request, TokenLogprob, check_request
from .speculate import DraftState, ngram_drafts
from .testhook import STALL_ENV, stall_at

__all__ = ["CHOOSER_REFUSED", "DEFAULT_KV_BYTES", "DEFAULT_MAX_BATCH", "DEFAULT_STEP_TOKENS", "Event",
           "PREFILL_PATIENCE", "Request", "Scheduler", "TokenLogprob", "kv_bytes_per_position"]

# the stall test hook is armed by the environment the process started with
_STALL_ARMED = bool(os.environ.get(STALL_ENV))
DEFAULT_MAX_BATCH = 16
DEFAULT_STEP_TOKENS = 512  # rows per forward call: decode rows + prefill chunks
DEFAULT_KV_BYTES = 2 << 30
PREFILL_PATIENCE = 8  # steps a prompt may be passed over by shorter ones before it goes first


def kv_bytes_per_position(cfg: dict) -> int:
    """Bytes of KV cache one position takes: int8 K and V of every layer and
    KV head plus their int32 absmax scales (csrc/include/intdet/model.h
    KVCache)."""
    return cfg["num_layers"] * cfg["num_kv_heads"] * (2 * cfg["head_dim"] + 2 * 4)



class Scheduler(Outputs):
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

    def check(self, req: Request, ids_checked: bool = False) -> None:
        """IntdetError when ``req`` can never run (request.check_request,
        under this scheduler's context, vocabulary and KV budget);
        ``ids_checked``: the caller has already checked the prompt's ids
        (errors.check_token_ids naming its own field), so they are not
        scanned again. A request that passed is not checked again by
        ``submit``."""
        check_request(req, self.engine.context_length, self.engine.vocab_size, self.kv_per_pos, self.kv_bytes,
                      ids_checked)
        req._checked_by = self

    def _positions(self, req: Request) -> int:
        return min(self.engine.context_length, len(req.prompt_ids) + req.max_new_tokens)

    def submit(self, req: Request) -> Request:
        """Queue ``req`` (checked first unless ``check`` passed it: IntdetError
        when it can never run)."""
        if req._checked_by is not self:
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
        if _STALL_ARMED:  # test hook (testhook.py): no work per step unless its variable was set at start
            stall_at(f"engine-step-{self.steps + 1}")
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
