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
    ``chunk(i, ev)``: the chunk of choice i's event, or a list of chunks;
    ``every_token``: call it for token events with no text too (a tool
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
            for c in first or []:
                yield _sse(c)
            for i, text in enumerate(echo_texts or []):
                if text:
                    yield _sse(chunk(i, _TextEvent(runs[i][0], text)))
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
                out = chunk(i, ev)
                for c in out if isinstance(out, list) else [out]:
                    yield _sse(c)
                if ev.kind == "done":
                    left -= 1
            if include_usage:
                n_out = sum(len(req.tokens) for req, _ in runs)
                yield _sse(usage_chunk(srv.usage(runs, n_prompt, n_out)))
            yield "data: [DONE]\n\n"
        finally:
            srv.finished(runs)
            for p in pumps:
                p.cancel()
            for req, _ in runs:
                if not req.done.is_set():
                    req.cancel()
                    srv.counts["cancelled"] += 1

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
