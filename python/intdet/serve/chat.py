"""``POST /v1/chat/completions``: messages rendered by the model's chat
template, to chat completions, whole or streamed, with logprobs."""

from __future__ import annotations

import asyncio
import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..api import derive_seed
from . import protocol as P
from .common import FINISH, BadRequest
from .logprobs import chat_logprob
from .sse import sse


async def create_chat_completion(srv, request: Request):
    r = await srv.body(request, P.ChatRequest)
    srv.check_model(r.model)
    srv.check_shape(r, 1)
    ids = srv.chat_ids(r.messages)
    mt = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
    if mt is None:
        if len(ids) >= srv.llm.context_length:
            srv.check_room(ids, 1, "messages")
        mt = srv.llm.context_length - len(ids)
    srv.check_room(ids, mt, "messages")
    if r.top_logprobs is not None and not r.logprobs:  # as OpenAI: top_logprobs needs logprobs
        raise BadRequest("top_logprobs: needs \"logprobs\": true", param="top_logprobs")
    k = (r.top_logprobs or 0) if r.logprobs else None
    seed = srv.new_seed(r.seed)
    grammar = await srv.structured(r)
    jobs = [(ids, srv.sampling(r, mt, derive_seed(seed, c), k, None, grammar)) for c in range(r.n)]
    runs = srv.launch(asyncio.get_running_loop(), jobs)
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if r.stream:
        include_usage = bool(r.stream_options and r.stream_options.include_usage)
        head = lambda choices: {"id": cid, "object": "chat.completion.chunk", "created": created,  # noqa: E731
                                "model": srv.model_name, "system_fingerprint": srv.llm.system_fingerprint,
                                "choices": choices}
        return sse(srv, request, runs, lambda i, ev: head([chat_delta(srv, i, ev, k)]), len(ids), include_usage,
                   lambda usage: dict(head([]), usage=usage),
                   first=[head([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}]) for i in range(len(runs))])
    await srv.wait_all(request, runs)
    choices = []
    for i, (req, _) in enumerate(runs):
        srv.raise_failed(req)
        choices.append({"index": i, "message": {"role": "assistant", "content": req.text},
                        "logprobs": None if k is None else
                        {"content": [chat_logprob(srv.llm, lp, k) for lp in req.token_logprobs]},
                        "finish_reason": FINISH[req.finish_reason], "stop_reason": req.stop_string,
                        "hash": req.hash, "seed": req.sampler.seed})
    n_out = sum(len(req.tokens) for req, _ in runs)
    return JSONResponse({"id": cid, "object": "chat.completion", "created": created, "model": srv.model_name,
                         "system_fingerprint": srv.llm.system_fingerprint, "choices": choices,
                         "usage": srv.usage(runs, len(ids), n_out)})


def chat_delta(srv, i, ev, k):
    req = ev.request
    if ev.kind == "done":
        return {"index": i, "delta": {}, "logprobs": None, "finish_reason": FINISH[req.finish_reason],
                "stop_reason": req.stop_string, "hash": req.hash, "seed": req.sampler.seed}
    lp = None
    if k is not None and ev.logprob is not None:
        lp = {"content": [chat_logprob(srv.llm, ev.logprob, k)]}
    return {"index": i, "delta": {"content": ev.text}, "logprobs": lp, "finish_reason": None}
