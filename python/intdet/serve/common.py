"""What the endpoints of ``intdet serve`` share: the server's state
(``Server``) and ``Limits``, ``BadRequest`` and the OpenAI error body, request
body parsing and checks, sampling parameters, and launching requests on the
engine (events reach the event loop through ``Mailbox``)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from ..api import LLM, Completion, SamplingParams
from ..errors import IntdetError
from . import protocol as P
from .metrics import Metrics

_log = logging.getLogger("intdet.serve")
PARSE_INLINE_BYTES = 64 << 10  # larger request bodies are parsed in a worker thread
GRAMMAR_WORKERS = 2  # threads compiling structured outputs (a flood of slow grammars waits, within grammar_seconds)

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "cancelled": "abort",
          "error": "error"}


@dataclass
class Limits:
    """Per-request limits (the server's options)."""

    max_body_bytes: int = 8 << 20
    allow_weight_updates: bool = False  # POST /v1/weights (serve/weights.py)
    max_weights_bytes: int = 2048 << 20  # its safetensors body
    max_n: int = 16
    max_prompts: int = 256
    max_stop: int = 16
    grammar_seconds: float = 1.5  # a structured output's compile and check, queueing included
    max_tokenize_bytes: int = 1 << 20  # /tokenize's text (prompt, or the messages' contents)
    max_detokenize_tokens: int = 1 << 18  # /detokenize's ids


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


def error_response(status: int, message: str, param=None, kind=None) -> JSONResponse:
    kind = kind or {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error",
                    503: "service_unavailable"}.get(status, "invalid_request_error" if status < 500 else "server_error")
    return JSONResponse(P.error_body(message, kind, param, status), status_code=status)


class Mailbox:
    """Events from the engine thread to the event loop's queues. A decode
    step emits one event per running request; waking the loop
    (``call_soon_threadsafe``: a self-pipe write and a loop iteration) once
    per batch instead of once per event keeps the loop's share of the two
    cores small while the forward needs them. Per queue, events keep their
    order."""

    def __init__(self, loop):
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list = []

    def post(self, q: asyncio.Queue, ev) -> None:
        """From any thread: deliver ``ev`` to ``q`` on the loop. Raises
        RuntimeError when the loop is closed (the scheduler cancels the request)."""
        with self._lock:
            wake = not self._items
            self._items.append((q, ev))
        if wake:  # else a drain is already scheduled and will take this one too
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for q, ev in items:
            q.put_nowait(ev)


class RunQueue(asyncio.Queue):
    """One choice's events on the event loop, and what they have delivered
    so far (tokens, text, log-probabilities, the chain hash's state).

    ``abort()`` ends the choice on the loop at once, without waiting for the
    engine (whose step may run for seconds): it queues a "done" event
    carrying the choice's ``Completion`` built from what was delivered
    (``aborted``), and drops the engine's later events. The server's drain
    relies on it."""

    def __init__(self, req):
        super().__init__()
        self.req = req
        self.tokens: list[int] = []
        self.text = ""
        self.token_logprobs: list = []
        self.chain_state: bytes | None = None
        self.ended = False  # a done/error event was queued (the engine's or abort's)
        self.aborted: Completion | None = None  # the drain's result, once it ended this choice

    def put_nowait(self, ev) -> None:
        if self.aborted is not None:
            return  # the engine caught up after the abort: the client has its answer
        if ev.kind == "token":
            if ev.token is not None:
                self.tokens.append(ev.token)
                self.chain_state = ev.chain_state
            if ev.logprob is not None:
                self.token_logprobs.append(ev.logprob)
            self.text += ev.text
        else:
            self.ended = True
        super().put_nowait(ev)

    def abort(self, llm) -> Completion | None:
        """End this choice now as finish_reason "abort" (cancelling its
        request); returns its Completion, or None when it had ended."""
        if self.ended or self.aborted is not None:
            return None
        self.req.cancel()
        self.aborted = _aborted(self, llm)
        self.ended = True
        super().put_nowait(_AbortEvent(self.aborted))
        return self.aborted


def _aborted(q: RunQueue, llm) -> Completion:
    """The Completion of a choice the drain ended (finish_reason
    "cancelled"), from the events its client received (the text held back
    for a stop string is not in it). Its hash is the chain hash after the
    received tokens (docs/chain-hash.md), a request cancelled at that
    point; its receipt (when asked) holds those tokens."""
    from ..hashing import ChainHash

    req = q.req
    state = q.chain_state
    if state is None:  # no token yet: the hash of the prompt alone
        state = ChainHash(llm.lm.cfg["format_version"], llm.lm.model_sha256, req.prompt_ids[:req.score_from]).state
    pl = None
    if req.prompt_logprobs is not None:  # filled by prefill; pad what it has not reached
        pl = list(req.prompt_token_logprobs)
        pl += [None] * (len(req.prompt_ids) - len(pl))
    receipt = None
    if req.receipt_head is not None:  # the receipt of the tokens received: it replays like any other
        from types import SimpleNamespace

        from ..receipts import finish

        receipt = finish(req.receipt_head, SimpleNamespace(
            prompt_ids=req.prompt_ids, tokens=list(q.tokens), finish_reason="cancelled", chain_hash=state.hex(),
            step_hashes=None, model_version=req.model_version))
    return Completion(prompt_ids=req.prompt_ids, tokens=list(q.tokens), text=q.text, finish_reason="cancelled",
                      hash=state.hex()[:12], hashes={}, seed=req.sampler.seed,
                      logprobs=list(q.token_logprobs) if req.logprobs is not None else None, prompt_logprobs=pl,
                      truncated=req.truncated, cached_tokens=req.cached_tokens, model_version=req.model_version,
                      receipt=receipt)


class _AbortEvent:
    """The "done" event of a choice the drain ended, with its Completion."""

    kind = "done"
    token = None
    text = ""
    logprob = None
    error = ""
    request = None

    def __init__(self, completion: Completion):
        self.completion = completion


class Server:
    """The state the endpoints share over one ``LLM`` whose scheduler runs
    in its thread, and the request plumbing they call."""

    def __init__(self, llm: LLM, model_name: str, api_key: str | None = None, limits: Limits | None = None):
        self.llm = llm
        self.model_name = model_name
        self.api_key = api_key
        self.limits = limits or Limits()
        self.created = int(time.time())
        self.counts = {"requests": 0, "cancelled": 0, "errors": 0, "aborted": 0}
        self.metrics = Metrics(llm.scheduler, model_name, llm.context_length, FINISH)
        self._mailbox: Mailbox | None = None
        self.draining = False  # set by the drain: new requests get a 503
        self._live: dict[int, list] = {}  # id -> a request's runs list, while its endpoint answers
        self._grammar_pool: ThreadPoolExecutor | None = None
        self._warm_grammar_tokenizer()

    def _warm_grammar_tokenizer(self) -> None:
        """Build llguidance's view of the tokenizer now: it holds the GIL
        (~0.5 s for 49k ids), so built at the first structured request it
        would stall the event loop. Without llguidance (or for a tokenizer it
        cannot read) the first structured request reports it."""
        from ..structured import grammar_tokenizer

        try:
            grammar_tokenizer(self.llm.tokenizer, self.llm.eos_ids)
        except IntdetError:
            pass

    # ------------------------------------------------------------ plumbing

    async def body(self, request: Request, model):
        """The request body parsed into ``model`` (BadRequest otherwise)."""
        n = request.headers.get("content-length")
        if n is not None and not n.isdigit():
            raise BadRequest(f"Content-Length: {n[:40]!r} is not a byte count")
        if n is not None and int(n) > self.limits.max_body_bytes:
            raise BadRequest(f"request body larger than {self.limits.max_body_bytes} bytes", status=413)
        chunks, size = [], 0
        async for c in request.stream():
            size += len(c)
            if size > self.limits.max_body_bytes:
                raise BadRequest(f"request body larger than {self.limits.max_body_bytes} bytes", status=413)
            chunks.append(c)
        raw = b"".join(chunks)
        if len(raw) > PARSE_INLINE_BYTES:  # ~10 ms a MB: in a thread, so the loop keeps serving
            return await asyncio.to_thread(_parse, raw, model)
        return _parse(raw, model)

    def check_model(self, name):
        if name is not None and name not in (self.model_name, ""):
            raise BadRequest(f"model: {name!r} is not served here (this server serves {self.model_name!r})",
                             "model", status=404)

    def sampling(self, r, max_tokens: int, seed: int, logprobs, prompt_logprobs, grammar=None) -> SamplingParams:
        """The SamplingParams of request ``r``; ``grammar``: its compiled
        structured output (``await structured(r)``) or None."""
        stops = [r.stop] if isinstance(r.stop, str) else list(r.stop or [])
        if len(stops) > self.limits.max_stop:
            raise BadRequest(f"stop: at most {self.limits.max_stop} strings", "stop")
        temperature = 1 if r.temperature is None else r.temperature
        try:  # SamplingParams checks every field when made
            sp = SamplingParams(max_tokens=max_tokens, temperature=_dec(temperature), top_p=_dec(r.top_p or 1),
                                top_k=max(r.top_k or 0, 0), min_p=_dec(r.min_p or 0),
                                repeat_penalty=_dec(r.repetition_penalty or 1), repeat_last_n=-1 if
                                r.repetition_penalty not in (None, 1) else 64, seed=seed, stop=stops,
                                logprobs=logprobs, prompt_logprobs=prompt_logprobs, structured_outputs=grammar)
        except IntdetError as e:
            raise BadRequest(str(e), e.field) from None
        return sp

    async def structured(self, r):
        """The compiled structured output of request ``r`` (response_format,
        OpenAI's, or structured_outputs, vLLM's; ``grammar``), or None;
        BadRequest naming the field the client sent."""
        from ..structured import StructuredOutputsParams

        rf, so = r.response_format, r.structured_outputs
        if rf is not None and rf.type != "text" and so is not None:
            raise BadRequest("response_format: give response_format or structured_outputs, not both",
                             "response_format")
        if rf is not None and rf.type == "json_schema" and rf.json_schema is None:
            raise BadRequest("response_format.json_schema: required when type is \"json_schema\"", "response_format")
        names, t0 = {}, time.monotonic()
        try:
            if rf is not None and rf.type == "json_object":
                params, names = StructuredOutputsParams(json_object=True), {"structured_outputs.json_object":
                                                                            "response_format"}
            elif rf is not None and rf.type == "json_schema":
                names = {"structured_outputs.json": "response_format.json_schema.schema"}
                params = StructuredOutputsParams(json=rf.json_schema.schema_)
            elif so is not None:
                params = StructuredOutputsParams(**{k: v for k, v in so.model_dump(by_alias=True).items()
                                                    if v is not None})
            else:
                return None
        except IntdetError as e:
            raise _refused(_renamed(e, names), t0) from None
        return await self.grammar(params, names)

    async def grammar(self, params, names: dict | None = None):
        """``params`` (a ``StructuredOutputsParams``) compiled and checked for
        the model (``LLM.grammar``, whose cache keeps the outcome) in a worker
        thread within ``limits.grammar_seconds``, so the event loop keeps
        serving while it compiles: the ``Grammar``, or BadRequest (400) in one
        line naming the field the client sent (``names`` maps the API's
        "structured_outputs.<kind>" to it, e.g. {"structured_outputs.json":
        "tools[0].function.parameters"}), logged on "intdet.serve". A compile
        past the time limit goes on in its thread (llguidance's own limits
        end it) and its outcome is cached for the next request."""
        loop = asyncio.get_running_loop()
        if self._grammar_pool is None:
            self._grammar_pool = ThreadPoolExecutor(GRAMMAR_WORKERS, thread_name_prefix="intdet-grammar")
        t0 = time.monotonic()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._grammar_pool, self.llm.grammar, params),
                                          self.limits.grammar_seconds)
        except IntdetError as e:
            err = _renamed(e, names or {})
        except asyncio.TimeoutError:
            f = params.field()
            f = (names or {}).get(f, f)
            err = BadRequest(f"{f}: took more than {self.limits.grammar_seconds:g} s to compile; "
                             "give a simpler one", f)
        raise _refused(err, t0)

    def check_shape(self, r, n_prompts: int):
        if r.n > self.limits.max_n:
            raise BadRequest(f"n: {r.n} is more than this server's limit of {self.limits.max_n}", "n")
        if r.best_of is not None and r.best_of != r.n:
            raise BadRequest("best_of: not supported (only best_of == n)", "best_of")
        if n_prompts * r.n > self.limits.max_prompts:
            raise BadRequest(f"prompt: {n_prompts} prompts x n={r.n} is more than this server's limit of "
                             f"{self.limits.max_prompts} sequences per request", "prompt")

    def check_room(self, ids: list, max_tokens: int, what: str = "prompt"):
        ctx = self.llm.context_length
        if len(ids) + max_tokens > ctx:
            name = "max_tokens" if len(ids) < ctx else what  # the message starts with the param it names
            raise BadRequest(f"{name}: this model's maximum context length is {ctx} tokens; the request needs "
                             f"{len(ids) + max_tokens} ({len(ids)} in the prompt, {max_tokens} for max_tokens)", name)

    def launch(self, loop, jobs, ids_checked: bool = False):
        """Submit (prompt_ids, SamplingParams) jobs (``ids_checked``: their
        ids are checked already, LLM.request's); returns the runs list
        [(scheduler Request, RunQueue)]. The list is live until the endpoint
        calls ``finished(runs)`` (``wait_all`` and ``sse`` do): until then the
        drain may end a choice (RunQueue.abort). The endpoints read each
        choice's outcome as a Completion (``result``, ``final``)."""
        if self.draining:
            raise BadRequest("the server is shutting down", status=503)
        if self._mailbox is None or self._mailbox.loop is not loop:
            self._mailbox = Mailbox(loop)
        post, finished = self._mailbox.post, self.metrics.finished

        def on_event(ev, q):
            if ev.kind != "token":  # counted before the client can see the end
                finished(ev.request)
            post(q, ev)

        out = []
        for ids, sp in jobs:
            q = RunQueue(None)
            req = self.llm.request(ids, sp, on_event=lambda ev, q=q: on_event(ev, q), ids_checked=ids_checked)
            q.req = req
            out.append((req, q))
        try:
            for req, _ in out:
                self.llm.scheduler.submit(req)
        except IntdetError as e:
            for req, _ in out:
                req.cancel()
            raise BadRequest(str(e), status=503 if "shutting down" in str(e) else 400) from None
        self.counts["requests"] += len(out)
        self._live[id(out)] = out
        return out

    def finished(self, runs) -> None:
        """The endpoint has answered for ``runs``: the drain leaves them be."""
        self._live.pop(id(runs), None)

    def abort_all(self) -> int:
        """The drain's deadline (on the event loop): end every choice still
        running as a whole finish_reason "abort" answer now, whatever the
        engine's step in flight; returns how many were ended."""
        n = 0
        for runs in list(self._live.values()):
            for _, q in runs:
                if q.abort(self.llm) is not None:
                    n += 1
        self.counts["aborted"] += n
        return n

    def result(self, run) -> Completion:
        """The Completion of a finished run (Request, RunQueue): the drain's
        when it ended the choice."""
        req, q = run
        return q.aborted if q.aborted is not None else self.llm.completion(req)

    def final(self, ev) -> Completion:
        """The Completion of a choice's "done" event (the drain's own for a
        choice it ended)."""
        return ev.completion if isinstance(ev, _AbortEvent) else self.llm.completion(ev.request)

    async def wait_all(self, request: Request, runs):
        """Wait until every run is done; a client that disconnects cancels them."""
        try:
            await self._wait_all(request, runs)
        finally:
            self.finished(runs)

    @staticmethod
    async def _wait_all(request: Request, runs):

        async def disconnected():
            while True:
                msg = await request.receive()
                if msg["type"] == "http.disconnect":
                    return

        async def done(q):
            while True:
                ev = await q.get()
                if ev.kind in ("done", "error"):
                    return

        watch = asyncio.ensure_future(disconnected())
        work = asyncio.ensure_future(asyncio.gather(*(done(q) for _, q in runs)))
        try:
            finished, _ = await asyncio.wait({watch, work}, return_when=asyncio.FIRST_COMPLETED)
            if watch in finished:
                raise ClientDisconnect()
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
                # read its outcome once it settles, so asyncio does not log
                # "exception was never retrieved" (CancelledError) for it
                work.add_done_callback(lambda f: f.cancelled() or f.exception())
            for req, _ in runs:
                req.cancel()

    def new_seed(self, given):
        return given if given is not None else int.from_bytes(os.urandom(8), "little")

    def chat_ids(self, messages, tools=None, add_generation_prompt: bool = True) -> list:
        try:
            return self.llm.chat_ids([m.openai() for m in messages], tools, add_generation_prompt)
        except IntdetError as e:
            msg = str(e)
            raise BadRequest(msg if msg.startswith("messages") else f"messages: {msg}", "messages") from None

    def usage(self, completions, n_prompt: int) -> dict:
        """OpenAI's usage block of the choices' Completions; with the prefix
        cache, prompt_tokens_details.cached_tokens: the prompt positions
        reused, summed over the choices (at most prompt_tokens, which counts
        a prompt once for its n choices)."""
        n_out = sum(len(c.tokens) for c in completions)
        u = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
        if self.llm.scheduler.cache is not None:
            u["prompt_tokens_details"] = {"cached_tokens": min(n_prompt, sum(c.cached_tokens for c in completions))}
        return u

    def raise_failed(self, c: Completion):
        """BadRequest 500 for a choice the engine failed (logged)."""
        if c.finish_reason == "error":
            self.engine_error(c.error)
            raise BadRequest(f"engine error: {c.error}", status=500)

    def engine_error(self, error: str) -> None:
        """Count a choice the engine failed, and say so in the log (one line)."""
        self.counts["errors"] += 1
        _log.error("engine error: %s", error.splitlines()[0][:300] if error else "")


def _parse(raw: bytes, model):
    """The JSON body ``raw`` parsed into the pydantic ``model`` (BadRequest otherwise)."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"body: not valid JSON ({str(e)[:120]})") from None
    if not isinstance(data, dict):
        raise BadRequest("body: must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        msg, field = P.validation_message(e)
        raise BadRequest(msg, field) from None


def _refused(err: BadRequest, t0: float) -> BadRequest:
    """``err``, logged in one line for the operator (a grammar refused)."""
    _log.warning("structured output refused in %.2f s: %s", time.monotonic() - t0, err)
    return err


def _renamed(e: IntdetError, names: dict) -> BadRequest:
    """BadRequest of a structured-output IntdetError, its field renamed to
    the one the client sent (``names``: API field -> request field)."""
    msg, field = str(e), e.field or "structured_outputs"
    if field in names and msg.startswith(field):
        msg, field = names[field] + msg[len(field):], names[field]
    return BadRequest(msg, field)


def _no_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def _dec(x) -> str:
    """A JSON number as the exact decimal intdet's sampler reads (shortest repr)."""
    return repr(x) if isinstance(x, float) else str(x)
