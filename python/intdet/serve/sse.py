"""Streaming responses of ``intdet serve``: the events of a request's runs as
server-sent events (text/event-stream), ending in ``[DONE]``."""

from __future__ import annotations

import asyncio
import json

from starlette.responses import StreamingResponse

from . import protocol as P


def sse(srv, request, runs, chunk, n_prompt, include_usage, usage_chunk, first=None, echo_texts=None,
        every_token=False):
    """A text/event-stream response: one chunk per token event of any
    choice (in the order the engine made them), a last chunk per choice
    with its finish_reason, hash and seed, the usage chunk when asked,
    then [DONE]. A client that goes away cancels every choice.
    ``chunk(i, ev, c)``: the chunk of choice i's event, or a list of
    chunks; ``c``: on its "done" event the choice's Completion
    (``Server.final``: the response's last fields are read from it), else
    None. ``every_token``: call it for token events with no text too (a tool
    call's parser reads every id; token ids asked for)."""

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
            for part in first or []:
                yield _sse(part)
            for i, text in enumerate(echo_texts or []):
                if text:
                    yield _sse(chunk(i, _TextEvent(text), None))
            finals: dict = {}  # choice -> its Completion, from its "done" event
            left = len(runs)
            while left:
                i, ev = await next_event()
                if ev.kind == "error":
                    srv.engine_error(ev.error)
                    yield _sse(P.error_body(f"engine error: {ev.error}", "server_error", None, 500))
                    left -= 1
                    continue
                if ev.kind == "token" and not ev.text and ev.logprob is None and not (every_token and ev.token is not None):
                    continue  # a token with no visible text yet (held back, or a partial character)
                c = None
                if ev.kind == "done":
                    c = finals[i] = srv.final(ev)
                out = chunk(i, ev, c)
                for part in out if isinstance(out, list) else [out]:
                    yield _sse(part)
                if ev.kind == "done":
                    left -= 1
            if include_usage:  # a choice that failed (an "error" event) counts what its request made
                done = [finals[i] if i in finals else srv.result(run) for i, run in enumerate(runs)]
                yield _sse(usage_chunk(srv.usage(done, n_prompt)))
            yield "data: [DONE]\n\n"
        finally:
            srv.finished(runs)
            for p in pumps:
                p.cancel()
            for req, q in runs:
                if q.aborted is None and not req.done.is_set():
                    req.cancel()
                    srv.counts["cancelled"] += 1

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class _TextEvent:
    """A stream chunk of text only (the echoed prompt)."""

    kind = "token"
    token = None
    logprob = None

    def __init__(self, text):
        self.text = text


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"
