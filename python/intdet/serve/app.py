"""The ASGI app of ``intdet serve``: OpenAI-compatible endpoints (vLLM's
shapes) in front of one engine loop.

Starlette routes; the scheduler (scheduler.py) runs in its own thread and
hands each request's events to an asyncio queue (through ``Mailbox``: one
``call_soon_threadsafe`` wake-up per batch of events), so a slow client only buffers its own tokens and a client that goes away
cancels its requests (its batch slot is free at the next step).

Every choice carries ``hash`` (its chain hash, docs/chain-hash.md) and
``seed`` (the sampler's seed: the request's, or one drawn by the server when
it gave none; choice i of n derives its own, api.derive_seed); every
response names ``system_fingerprint`` (model file and format version only).
Log-probabilities are the fixed-point log-softmax of logprobs.py: the same
numbers on every machine.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..api import LLM, SamplingParams, derive_seed
from ..errors import IntdetError, check_token_ids
from ..logprobs import to_float
from . import protocol as P

_log = logging.getLogger("intdet.serve")

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "cancelled": "abort",
          "error": "error"}


@dataclass
class Limits:
    """Per-request limits (the server's options)."""

    max_body_bytes: int = 8 << 20
    max_n: int = 16
    max_prompts: int = 256
    max_stop: int = 16


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


def _error(status: int, message: str, param=None, kind=None) -> JSONResponse:
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


class Server:
    """The endpoints over one ``LLM`` whose scheduler runs in its thread."""

    def __init__(self, llm: LLM, model_name: str, api_key: str | None = None, limits: Limits | None = None):
        self.llm = llm
        self.model_name = model_name
        self.api_key = api_key
        self.limits = limits or Limits()
        self.created = int(time.time())
        self.counts = {"requests": 0, "cancelled": 0, "errors": 0}
        self._mailbox: Mailbox | None = None

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

    def check_model(self, name):
        if name is not None and name not in (self.model_name, ""):
            raise BadRequest(f"model: {name!r} is not served here (this server serves {self.model_name!r})",
                             "model", status=404)

    def sampling(self, r, max_tokens: int, seed: int, logprobs, prompt_logprobs) -> SamplingParams:
        stops = [r.stop] if isinstance(r.stop, str) else list(r.stop or [])
        if len(stops) > self.limits.max_stop:
            raise BadRequest(f"stop: at most {self.limits.max_stop} strings", "stop")
        temperature = 1 if r.temperature is None else r.temperature
        structured = self.structured(r)
        try:  # SamplingParams checks every field when made
            sp = SamplingParams(max_tokens=max_tokens, temperature=_dec(temperature), top_p=_dec(r.top_p or 1),
                                top_k=max(r.top_k or 0, 0), min_p=_dec(r.min_p or 0),
                                repeat_penalty=_dec(r.repetition_penalty or 1), repeat_last_n=-1 if
                                r.repetition_penalty not in (None, 1) else 64, seed=seed, stop=stops,
                                logprobs=logprobs, prompt_logprobs=prompt_logprobs, structured_outputs=structured)
        except IntdetError as e:
            raise BadRequest(str(e), e.field) from None
        return sp

    def structured(self, r):
        """The request's StructuredOutputsParams (response_format, OpenAI's,
        or structured_outputs, vLLM's), compiled here so a bad schema or
        grammar is a 400 naming the field (compiled grammars are cached by
        the LLM: a schema sent with every request is compiled once)."""
        from ..structured import StructuredOutputsParams

        rf, so = r.response_format, r.structured_outputs
        if rf is not None and rf.type != "text" and so is not None:
            raise BadRequest("response_format: give response_format or structured_outputs, not both",
                             "response_format")
        if rf is not None and rf.type == "json_schema" and rf.json_schema is None:
            raise BadRequest("response_format.json_schema: required when type is \"json_schema\"", "response_format")
        where = {}
        try:
            if rf is not None and rf.type == "json_object":
                params, where = StructuredOutputsParams(json_object=True), {"json_object": "response_format"}
            elif rf is not None and rf.type == "json_schema":
                params = StructuredOutputsParams(json=rf.json_schema.schema_)
                where = {"json": "response_format.json_schema.schema"}
            elif so is not None:
                params = StructuredOutputsParams(**{k: v for k, v in so.model_dump(by_alias=True).items()
                                                    if v is not None})
            else:
                return None
            self.llm.grammar(params)
        except IntdetError as e:
            msg, field = str(e), e.field or "structured_outputs"
            for k, name in where.items():  # name the field the client sent
                f = f"structured_outputs.{k}"
                if field == f:
                    msg, field = name + msg[len(f):], name
            raise BadRequest(msg, field) from None
        return params

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
            raise BadRequest(f"{what}: this model's maximum context length is {ctx} tokens; the request needs "
                             f"{len(ids) + max_tokens} ({len(ids)} in the prompt, {max_tokens} for max_tokens)",
                             "max_tokens" if len(ids) < ctx else what)

    def launch(self, loop, jobs):
        """Submit (prompt_ids, SamplingParams) jobs; returns [(scheduler Request, asyncio.Queue)]."""
        if self._mailbox is None or self._mailbox.loop is not loop:
            self._mailbox = Mailbox(loop)
        post = self._mailbox.post
        out = []
        for ids, sp in jobs:
            q: asyncio.Queue = asyncio.Queue()
            req = self.llm.request(ids, sp, on_event=lambda ev, q=q: post(q, ev))
            out.append((req, q))
        try:
            for req, _ in out:
                self.llm.scheduler.submit(req)
        except IntdetError as e:
            for req, _ in out:
                req.cancel()
            raise BadRequest(str(e), status=503 if "shutting down" in str(e) else 400) from None
        self.counts["requests"] += len(out)
        return out

    @staticmethod
    async def wait_all(request: Request, runs):
        """Wait until every run is done; a client that disconnects cancels them."""

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

    # ------------------------------------------------------------ logprobs shapes

    def completion_logprobs(self, req, echo: bool, k: int, text_start: int = 0) -> dict:
        toks, lps, tops = [], [], []
        if echo:
            pl = req.prompt_token_logprobs if req.prompt_logprobs is not None else [None] * len(req.prompt_ids)
            for tok, lp in zip(req.prompt_ids, pl):
                toks.append(tok)
                lps.append(None if lp is None else to_float(lp.logprob_q))
                tops.append(None if lp is None else self.top_dict(lp, k))
        for lp in req.token_logprobs:
            toks.append(lp.token)
            lps.append(to_float(lp.logprob_q))
            tops.append(self.top_dict(lp, k))
        strs = [self.llm.token_text(t) for t in toks]
        offsets, at = [], text_start
        for s in strs:
            offsets.append(at)
            at += len(s)
        return {"tokens": strs, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}

    def top_dict(self, lp, k: int) -> dict:
        d = {}
        for t, q in lp.top[:k]:
            d.setdefault(self.llm.token_text(t), to_float(q))
        d.setdefault(self.llm.token_text(lp.token), to_float(lp.logprob_q))
        return d

    def chat_logprob(self, lp, k: int) -> dict:
        s = self.llm.token_text(lp.token)
        return {"token": s, "logprob": to_float(lp.logprob_q), "bytes": list(s.encode("utf-8")),
                "top_logprobs": [{"token": self.llm.token_text(t), "logprob": to_float(q),
                                  "bytes": list(self.llm.token_text(t).encode("utf-8"))} for t, q in lp.top[:k]]}

    # ------------------------------------------------------------ endpoints

    async def health(self, request: Request):
        return Response(status_code=200)

    async def stats(self, request: Request):
        s = self.llm.scheduler
        return JSONResponse({"running": len(s.running), "waiting": len(s.waiting), "kv_used_bytes": s.kv_used,
                             "kv_bytes": s.kv_bytes, "steps": s.steps, "max_batch": s.max_batch,
                             "spec_drafted_tokens": s.spec_drafted, "spec_accepted_tokens": s.spec_accepted,
                             **({"prefix_cache": {"entries": len(s.cache), "bytes": s.cache.bytes,
                                                  "lookups": s.cache.lookups, "hits": s.cache.hits,
                                                  "hit_tokens": s.cache.hit_tokens}} if s.cache is not None else {}),
                             **self.counts})

    async def models(self, request: Request):
        return JSONResponse({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created, "owned_by": "intdet",
            "root": self.model_name, "max_model_len": self.llm.context_length,
            "system_fingerprint": self.llm.system_fingerprint}]})

    async def tokenize(self, request: Request):
        r = await self.body(request, P.TokenizeRequest)
        self.check_model(r.model)
        if (r.prompt is None) == (r.messages is None):
            raise BadRequest("body: give either prompt or messages", "prompt")
        if r.messages is not None:
            ids = self.chat_ids(r.messages)
        else:
            try:
                ids = self.llm.encode(r.prompt, add_bos=None if r.add_special_tokens else False)
            except IntdetError as e:
                raise BadRequest(str(e), "prompt") from None
        return JSONResponse({"count": len(ids), "max_model_len": self.llm.context_length, "tokens": ids})

    async def detokenize(self, request: Request):
        r = await self.body(request, P.DetokenizeRequest)
        self.check_model(r.model)
        try:
            return JSONResponse({"prompt": self.llm.decode(r.tokens)})
        except IntdetError as e:
            raise BadRequest(str(e).replace("tokens:", "tokens:", 1), "tokens") from None

    def chat_ids(self, messages) -> list:
        try:
            return self.llm.chat_ids([{"role": m.role, "content": m.text()} for m in messages])
        except IntdetError as e:
            msg = str(e)
            raise BadRequest(msg if msg.startswith("messages") else f"messages: {msg}", "messages") from None

    def prompts_of(self, prompt) -> list:
        if isinstance(prompt, str):
            plist = [prompt]
        elif prompt and all(isinstance(x, int) for x in prompt):
            plist = [prompt]
        else:
            plist = list(prompt)
        if not plist:
            raise BadRequest("prompt: empty list", "prompt")
        if len(plist) > self.limits.max_prompts:
            raise BadRequest(f"prompt: more than {self.limits.max_prompts} prompts", "prompt")
        out = []
        for i, p in enumerate(plist):
            where = "prompt" if len(plist) == 1 else f"prompt[{i}]"
            try:
                ids = self.llm.encode(p) if isinstance(p, str) else list(p)
            except IntdetError as e:  # not valid Unicode text
                raise BadRequest(str(e).replace("prompt", where, 1), "prompt") from None
            if not ids:
                raise BadRequest(f"{where}: empty", "prompt")
            try:
                check_token_ids(ids, self.llm.vocab_size, where)
            except IntdetError as e:
                raise BadRequest(str(e), "prompt") from None
            out.append((ids, p if isinstance(p, str) else None))
        return out

    async def completions(self, request: Request):
        r = await self.body(request, P.CompletionRequest)
        self.check_model(r.model)
        prompts = self.prompts_of(r.prompt)
        self.check_shape(r, len(prompts))
        if r.stream and r.echo and r.logprobs is not None:
            raise BadRequest("echo: with logprobs, not supported when streaming", "echo")
        max_tokens = 16 if r.max_tokens is None else r.max_tokens
        seed = self.new_seed(r.seed)
        jobs, meta = [], []
        for p, (ids, text) in enumerate(prompts):
            self.check_room(ids, max_tokens, "prompt" if len(prompts) == 1 else f"prompt[{p}]")
            for c in range(r.n):
                s = derive_seed(seed, c)
                jobs.append((ids, self.sampling(r, max_tokens, s, r.logprobs,
                                                r.logprobs if r.echo and r.logprobs is not None else None)))
                meta.append((p, text))
        loop = asyncio.get_running_loop()
        runs = self.launch(loop, jobs)
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        n_prompt = sum(len(ids) for ids, _ in prompts)
        if r.stream:
            include_usage = bool(r.stream_options and r.stream_options.include_usage)
            offsets = [0] * len(runs)  # text_offset of each choice's next chunk

            def chunk(i, ev):
                d = self.completion_delta(i, ev, r.logprobs, offsets[i])
                offsets[i] += len(ev.text)
                return {"id": cid, "object": "text_completion", "created": created, "model": self.model_name,
                        "system_fingerprint": self.llm.system_fingerprint, "choices": [d]}

            return self.sse(request, runs, chunk, n_prompt, include_usage,
                lambda usage: {"id": cid, "object": "text_completion", "created": created, "model": self.model_name,
                               "system_fingerprint": self.llm.system_fingerprint, "choices": [], "usage": usage},
                echo_texts=[self.echo_text(runs[i][0], meta[i][1]) if r.echo else "" for i in range(len(runs))])
        await self.wait_all(request, runs)
        choices = []
        for i, (req, _) in enumerate(runs):
            self.raise_failed(req)
            prefix = self.echo_text(req, meta[i][1]) if r.echo else ""
            choices.append({"index": i, "text": prefix + req.text,
                            "logprobs": None if r.logprobs is None else
                            self.completion_logprobs(req, r.echo, r.logprobs),
                            "finish_reason": FINISH[req.finish_reason], "stop_reason": None,
                            "hash": req.hash, "seed": req.sampler.seed})
        n_out = sum(len(req.tokens) for req, _ in runs)
        return JSONResponse({"id": cid, "object": "text_completion", "created": created, "model": self.model_name,
                             "system_fingerprint": self.llm.system_fingerprint, "choices": choices,
                             "usage": self.usage(runs, n_prompt, n_out)})

    def usage(self, runs, n_prompt: int, n_out: int) -> dict:
        """OpenAI's usage block; with the prefix cache, prompt_tokens_details
        .cached_tokens: the prompt positions reused, summed over the runs
        (at most prompt_tokens, which counts a prompt once for its n choices)."""
        u = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
        if self.llm.scheduler.cache is not None:
            u["prompt_tokens_details"] = {"cached_tokens": min(n_prompt, sum(req.cached_tokens for req, _ in runs))}
        return u

    def echo_text(self, req, text):
        return text if text is not None else self.llm.decode(req.prompt_ids)

    def raise_failed(self, req):
        if req.finish_reason == "error":
            self.counts["errors"] += 1
            raise BadRequest(f"engine error: {req.error}", status=500)

    def completion_delta(self, i, ev, k, offset: int):
        req = ev.request
        d = {"index": i, "text": ev.text, "logprobs": None, "finish_reason": None}
        if ev.kind == "token" and k is not None and ev.logprob is not None:
            s = self.llm.token_text(ev.token)
            d["logprobs"] = {"tokens": [s], "token_logprobs": [to_float(ev.logprob.logprob_q)],
                             "top_logprobs": [self.top_dict(ev.logprob, k)], "text_offset": [offset]}
        if ev.kind == "done":
            d.update(finish_reason=FINISH[req.finish_reason], hash=req.hash, seed=req.sampler.seed)
        return d

    async def chat(self, request: Request):
        r = await self.body(request, P.ChatRequest)
        self.check_model(r.model)
        self.check_shape(r, 1)
        ids = self.chat_ids(r.messages)
        mt = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
        if mt is None:
            if len(ids) >= self.llm.context_length:
                self.check_room(ids, 1, "messages")
            mt = self.llm.context_length - len(ids)
        self.check_room(ids, mt, "messages")
        if r.top_logprobs is not None and not r.logprobs:  # as OpenAI: top_logprobs needs logprobs
            raise BadRequest("top_logprobs: needs \"logprobs\": true", param="top_logprobs")
        k = (r.top_logprobs or 0) if r.logprobs else None
        seed = self.new_seed(r.seed)
        jobs = [(ids, self.sampling(r, mt, derive_seed(seed, c), k, None)) for c in range(r.n)]
        runs = self.launch(asyncio.get_running_loop(), jobs)
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if r.stream:
            include_usage = bool(r.stream_options and r.stream_options.include_usage)
            head = lambda choices: {"id": cid, "object": "chat.completion.chunk", "created": created,  # noqa: E731
                                    "model": self.model_name, "system_fingerprint": self.llm.system_fingerprint,
                                    "choices": choices}
            return self.sse(request, runs, lambda i, ev: head([self.chat_delta(i, ev, k)]), len(ids), include_usage,
                            lambda usage: dict(head([]), usage=usage),
                            first=[head([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                          "finish_reason": None}]) for i in range(len(runs))])
        await self.wait_all(request, runs)
        choices = []
        for i, (req, _) in enumerate(runs):
            self.raise_failed(req)
            choices.append({"index": i, "message": {"role": "assistant", "content": req.text},
                            "logprobs": None if k is None else
                            {"content": [self.chat_logprob(lp, k) for lp in req.token_logprobs]},
                            "finish_reason": FINISH[req.finish_reason], "hash": req.hash, "seed": req.sampler.seed})
        n_out = sum(len(req.tokens) for req, _ in runs)
        return JSONResponse({"id": cid, "object": "chat.completion", "created": created, "model": self.model_name,
                             "system_fingerprint": self.llm.system_fingerprint, "choices": choices,
                             "usage": self.usage(runs, len(ids), n_out)})

    def chat_delta(self, i, ev, k):
        req = ev.request
        if ev.kind == "done":
            return {"index": i, "delta": {}, "logprobs": None, "finish_reason": FINISH[req.finish_reason],
                    "hash": req.hash, "seed": req.sampler.seed}
        lp = None
        if k is not None and ev.logprob is not None:
            lp = {"content": [self.chat_logprob(ev.logprob, k)]}
        return {"index": i, "delta": {"content": ev.text}, "logprobs": lp, "finish_reason": None}

    def sse(self, request, runs, chunk, n_prompt, include_usage, usage_chunk, first=None, echo_texts=None):
        """A text/event-stream response: one chunk per token event of any
        choice (in the order the engine made them), a last chunk per choice
        with its finish_reason, hash and seed, the usage chunk when asked,
        then [DONE]. A client that goes away cancels every choice."""

        async def events():
            merged: asyncio.Queue = asyncio.Queue()

            async def pump(i, q):
                while True:
                    ev = await q.get()
                    await merged.put((i, ev))
                    if ev.kind in ("done", "error"):
                        return

            if len(runs) == 1:  # one choice (the common case): read its queue, no pump task
                only = runs[0][1]

                async def next_event():
                    return 0, await only.get()
                pumps = []
            else:
                next_event = merged.get
                pumps = [asyncio.ensure_future(pump(i, q)) for i, (_, q) in enumerate(runs)]
            try:
                for c in first or []:
                    yield _sse(c)
                for i, text in enumerate(echo_texts or []):
                    if text:
                        yield _sse(chunk(i, _TextEvent(runs[i][0], text)))
                left = len(runs)
                while left:
                    i, ev = await next_event()
                    if ev.kind == "error":
                        self.counts["errors"] += 1
                        yield _sse(P.error_body(f"engine error: {ev.error}", "server_error", None, 500))
                        left -= 1
                        continue
                    if ev.kind == "token" and not ev.text and ev.logprob is None:
                        continue  # a token with no visible text yet (held back, or a partial character)
                    yield _sse(chunk(i, ev))
                    if ev.kind == "done":
                        left -= 1
                if include_usage:
                    n_out = sum(len(req.tokens) for req, _ in runs)
                    yield _sse(usage_chunk(self.usage(runs, n_prompt, n_out)))
                yield "data: [DONE]\n\n"
            finally:
                for p in pumps:
                    p.cancel()
                for req, _ in runs:
                    if not req.done.is_set():
                        req.cancel()
                        self.counts["cancelled"] += 1

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class _TextEvent:
    """A stream chunk of text only (the echoed prompt)."""

    kind = "token"
    token = None
    logprob = None

    def __init__(self, request, text):
        self.request, self.text = request, text


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _no_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def _dec(x) -> str:
    """A JSON number as the exact decimal intdet's sampler reads (shortest repr)."""
    return repr(x) if isinstance(x, float) else str(x)


def create_app(llm: LLM, model_name: str, api_key: str | None = None, limits: Limits | None = None) -> Starlette:
    """The Starlette app. Starts the scheduler's loop thread at startup and
    cancels what is left at shutdown."""
    srv = Server(llm, model_name, api_key, limits)

    def guarded(fn, auth=True):
        async def endpoint(request: Request):
            if auth and srv.api_key is not None:
                given = request.headers.get("authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {srv.api_key}".encode()):
                    return _error(401, "missing or wrong API key (send 'Authorization: Bearer KEY')")
            try:
                return await fn(request)
            except BadRequest as e:
                return _error(e.status, str(e), e.param)
            except ClientDisconnect:
                srv.counts["cancelled"] += 1
                return Response(status_code=499)
            except IntdetError as e:
                return _error(400, str(e))
            except Exception as e:  # noqa: BLE001  (a bug: answer 500 in OpenAI's shape, keep serving)
                srv.counts["errors"] += 1
                # one line for the operator (the client gets no internals)
                _log.error("%s %s: internal error: %s: %s", request.method, request.url.path, type(e).__name__,
                           str(e).splitlines()[0][:300] if str(e) else "")
                return _error(500, f"internal error: {type(e).__name__}")

        return endpoint

    async def not_found(request, exc):
        status = getattr(exc, "status_code", 404)
        if srv.api_key is not None and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {srv.api_key}".encode()):
                return _error(401, "missing or wrong API key (send 'Authorization: Bearer KEY')")
        return _error(status, f"{request.method} {request.url.path}: "
                              f"{'no such endpoint' if status == 404 else 'method not allowed'}")

    async def server_error(request, exc):
        return _error(500, f"internal error: {type(exc).__name__}")

    routes = [
        Route("/health", guarded(srv.health, auth=False), methods=["GET"]),
        Route("/stats", guarded(srv.stats), methods=["GET"]),
        Route("/v1/models", guarded(srv.models), methods=["GET"]),
        Route("/tokenize", guarded(srv.tokenize), methods=["POST"]),
        Route("/detokenize", guarded(srv.detokenize), methods=["POST"]),
        Route("/v1/completions", guarded(srv.completions), methods=["POST"]),
        Route("/v1/chat/completions", guarded(srv.chat), methods=["POST"]),
    ]

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        llm.scheduler.start()
        try:
            yield
        finally:
            llm.scheduler.shutdown(cancel=True, timeout=30)

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: not_found, 500: server_error})
    app.state.server = srv
    return app
