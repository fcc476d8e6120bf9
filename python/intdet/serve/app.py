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

This module builds the app: routes, the API-key guard and the error
answers. The rest of serve/, one job a module:

* common.py: ``Server`` (state shared by the endpoints), ``Limits``,
  ``BadRequest``, body parsing and checks, launching runs, ``Mailbox``
* auth.py: the API-key check (the only one)
* sse.py: streamed responses (server-sent events)
* logprobs.py: log-probabilities in the responses' shapes
* completions.py: ``POST /v1/completions``
* chat.py: ``POST /v1/chat/completions``
* weights.py: ``POST /v1/weights`` (new weights, --allow-weight-updates)
* misc.py: ``/health``, ``/stats``, ``/metrics``, ``/v1/models``, ``/tokenize``, ``/detokenize``
* metrics.py: the Prometheus metrics behind ``/metrics`` (vLLM's names)
* protocol.py: the request shapes; http.py: uvicorn protocol additions

Add an endpoint: a function ``(srv, request)`` in a module of serve/ plus
one route in ``create_app`` below.
"""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..api import LLM
from ..errors import IntdetError
from . import misc, weights
from .auth import unauthorized
from .chat import create_chat_completion
from .common import BadRequest, Limits, Server, error_response
from .common import FINISH, Mailbox  # noqa: F401  (importable from here, as before the split)
from .completions import create_completion

_log = logging.getLogger("intdet.serve")


def create_app(llm: LLM, model_name: str, api_key: str | None = None, limits: Limits | None = None) -> Starlette:
    """The Starlette app. Starts the scheduler's loop thread at startup and
    cancels what is left at shutdown."""
    srv = Server(llm, model_name, api_key, limits)

    def guarded(fn, auth=True):
        async def endpoint(request: Request):
            denied = unauthorized(request, srv.api_key) if auth else None
            if denied is not None:
                return denied
            try:
                return await fn(srv, request)
            except BadRequest as e:
                return error_response(e.status, str(e), e.param)
            except ClientDisconnect:
                srv.counts["cancelled"] += 1
                return Response(status_code=499)
            except IntdetError as e:
                return error_response(400, str(e))
            except Exception as e:  # noqa: BLE001  (a bug: answer 500 in OpenAI's shape, keep serving)
                srv.counts["errors"] += 1
                # one line for the operator (the client gets no internals)
                _log.error("%s %s: internal error: %s: %s", request.method, request.url.path, type(e).__name__,
                           str(e).splitlines()[0][:300] if str(e) else "")
                return error_response(500, f"internal error: {type(e).__name__}")

        return endpoint

    async def not_found(request, exc):
        status = getattr(exc, "status_code", 404)
        denied = unauthorized(request, srv.api_key) if request.url.path != "/health" else None
        if denied is not None:
            return denied
        return error_response(status, f"{request.method} {request.url.path}: "
                                      f"{'no such endpoint' if status == 404 else 'method not allowed'}")

    async def server_error(request, exc):
        return error_response(500, f"internal error: {type(exc).__name__}")

    # One route per endpoint; an endpoint is a function (srv, request) in its module.
    routes = [
        Route("/health", guarded(misc.health, auth=False), methods=["GET"]),
        Route("/stats", guarded(misc.stats), methods=["GET"]),
        Route("/metrics", guarded(misc.metrics), methods=["GET"]),
        Route("/v1/models", guarded(misc.models), methods=["GET"]),
        Route("/tokenize", guarded(misc.tokenize), methods=["POST"]),
        Route("/detokenize", guarded(misc.detokenize), methods=["POST"]),
        Route("/v1/completions", guarded(create_completion), methods=["POST"]),
        Route("/v1/chat/completions", guarded(create_chat_completion), methods=["POST"]),
        Route("/v1/weights", guarded(weights.update_weights), methods=["POST"]),
    ]

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        llm.scheduler.start()
        try:
            yield
        finally:
            # Every response has been answered (the drain saw to it); a
            # forward call still in flight is not waited for long
            # (cli/serve.py leaves without it).
            llm.scheduler.shutdown(cancel=True, timeout=2)

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: not_found, 500: server_error})
    app.state.server = srv
    return app
