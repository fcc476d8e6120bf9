"""The small endpoints: ``GET /health``, ``GET /stats``, ``GET /metrics``,
``GET /v1/models``, ``POST /tokenize`` and ``POST /detokenize``."""

from __future__ import annotations

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
    r = await srv.body(request, P.TokenizeRequest)
    srv.check_model(r.model)
    if (r.prompt is None) == (r.messages is None):
        raise BadRequest("body: give either prompt or messages", "prompt")
    if r.messages is not None:
        ids = srv.chat_ids(r.messages)
    else:
        try:
            ids = srv.llm.encode(r.prompt, add_bos=None if r.add_special_tokens else False)
        except IntdetError as e:
            raise BadRequest(str(e), "prompt") from None
    return JSONResponse({"count": len(ids), "max_model_len": srv.llm.context_length, "tokens": ids})


async def detokenize(srv, request: Request):
    r = await srv.body(request, P.DetokenizeRequest)
    srv.check_model(r.model)
    try:
        return JSONResponse({"prompt": srv.llm.decode(r.tokens)})
    except IntdetError as e:
        raise BadRequest(str(e), "tokens") from None
