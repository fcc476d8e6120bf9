"""The small endpoints: ``GET /health``, ``GET /stats``, ``GET /metrics``,
``GET /v1/models``, ``POST /tokenize`` and ``POST /detokenize``."""

from __future__ import annotations

import asyncio
import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import IntdetError
from . import protocol as P
from .common import BadRequest


async def health(srv, request: Request):
    return Response(status_code=200)


async def stats(srv, request: Request):
    s = srv.llm.scheduler
    return JSONResponse({"running": len(s.running), "waiting": len(s.waiting), "kv_used_bytes": s.kv_used,
                         "kv_bytes": s.kv_bytes, "steps": s.steps, "max_batch": s.max_batch,
                         "spec_drafted_tokens": s.spec_drafted, "spec_accepted_tokens": s.spec_accepted,
                         **({"prefix_cache": {"entries": len(s.cache), "bytes": s.cache.bytes,
                                              "lookups": s.cache.lookups, "hits": s.cache.hits,
                                              "hit_tokens": s.cache.hit_tokens}} if s.cache is not None else {}),
                         **srv.counts})


async def metrics(srv, request: Request):
    """Prometheus metrics (metrics.py): text format, or OpenMetrics when the
    scraper's Accept header asks for it."""
    body, content_type = srv.metrics.render(request.headers.get("accept"))
    return Response(body, media_type=content_type)


async def models(srv, request: Request):
    return JSONResponse({"object": "list", "data": [{
        "id": srv.model_name, "object": "model", "created": srv.created, "owned_by": "intdet",
        "root": srv.model_name, "max_model_len": srv.llm.context_length,
        "system_fingerprint": srv.llm.system_fingerprint, "model_version": srv.llm.model_version}]})


async def tokenize(srv, request: Request):
    """Tokens of a prompt or messages, at most ``limits.max_tokenize_bytes``
    of text (413 naming the field past it), encoded in a worker thread (a
    MB takes about a second) so the event loop keeps serving."""
    r = await srv.body(request, P.TokenizeRequest)
    srv.check_model(r.model)
    if (r.prompt is None) == (r.messages is None):
        raise BadRequest("body: give either prompt or messages", "prompt")
    field, size = ("messages", sum(_utf8(m.text()) for m in r.messages)) if r.messages is not None else (
        "prompt", _utf8(r.prompt))
    limit = srv.limits.max_tokenize_bytes
    if size > limit:
        raise BadRequest(f"{field}: {size} bytes of text is more than this server's limit of {limit} for /tokenize",
                         field, status=413)

    def run() -> bytes:  # the encode and the JSON of its ids (~0.3 s for a MB of text) off the loop
        if r.messages is not None:
            ids = srv.chat_ids(r.messages, add_generation_prompt=r.add_generation_prompt)
        else:
            try:
                ids = srv.llm.encode(r.prompt, add_bos=None if r.add_special_tokens else False)
            except IntdetError as e:
                raise BadRequest(str(e), "prompt") from None
        return (f'{{"count":{len(ids)},"max_model_len":{srv.llm.context_length},"tokens":'
                f'{_json_ids(ids)}}}').encode()

    return Response(await asyncio.to_thread(run), media_type="application/json")


async def detokenize(srv, request: Request):
    """The text of at most ``limits.max_detokenize_tokens`` ids (413 naming
    ``tokens`` past it), decoded in a worker thread."""
    r = await srv.body(request, P.DetokenizeRequest)
    srv.check_model(r.model)
    limit = srv.limits.max_detokenize_tokens
    if len(r.tokens) > limit:
        raise BadRequest(f"tokens: {len(r.tokens)} ids is more than this server's limit of {limit} for /detokenize",
                         "tokens", status=413)

    def run() -> bytes:
        try:
            return JSONResponse({"prompt": srv.llm.decode(r.tokens)}).body
        except IntdetError as e:
            raise BadRequest(str(e), "tokens") from None

    return Response(await asyncio.to_thread(run), media_type="application/json")


def _json_ids(ids: list) -> str:
    """The JSON array of ``ids``, written a slice at a time: one json.dumps
    of a million ids holds the GIL (and so the event loop) for ~0.2 s."""
    step = 1 << 14
    return "[" + ",".join(json.dumps(ids[i:i + step])[1:-1] for i in range(0, len(ids), step)) + "]"


def _utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
