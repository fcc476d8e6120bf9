"""What ``intdet serve`` adds to uvicorn's HTTP protocol: a connection that
sends no request within ``idle_timeout`` seconds is closed, and the answer
past ``--max-connections`` is an OpenAI-shaped JSON 503.

uvicorn times out idle keep-alive connections only after a first request,
so sockets that connect and send nothing held the connection slots for
good: 64 of them locked every client out. uvicorn's own 503 past its
``limit_concurrency`` is plain text; clients of this API parse JSON errors.

Both reach into uvicorn's protocol classes (``cycle``, ``loop``,
``transport``; the module-level ``service_unavailable`` app its protocols
call): ``install_json_503`` leaves uvicorn alone where those names are
missing, and tests/serve/test_serve.py checks both behaviours on a real server.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from . import protocol as P

_BODY_503 = json.dumps(P.error_body("too many connections: the server's --max-connections is reached; retry later",
                                    "server_error", None, 503)).encode()


async def json_service_unavailable(scope, receive, send) -> None:
    """uvicorn's ``service_unavailable`` ASGI app with an OpenAI error body."""
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(_BODY_503)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": _BODY_503, "more_body": False})


def install_json_503() -> None:
    """Make uvicorn's HTTP protocols answer JSON past their concurrency limit."""
    from uvicorn.protocols.http import h11_impl

    mods = [h11_impl]
    try:
        from uvicorn.protocols.http import httptools_impl

        mods.append(httptools_impl)
    except ImportError:  # no httptools: h11 only
        pass
    for m in mods:
        if hasattr(m, "service_unavailable"):
            m.service_unavailable = json_service_unavailable


def protocol_class(idle_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's chosen HTTP protocol (httptools, else h11) closing a
    connection that has not started a request ``idle_timeout`` seconds after
    it was made."""

    class IdleClosingProtocol(AutoHTTPProtocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._intdet_idle = self.loop.call_later(idle_timeout, self._intdet_close_idle)

        def _intdet_close_idle(self) -> None:
            self._intdet_idle = None
            # uvicorn sets cycle when a request's headers are complete
            if getattr(self, "cycle", None) is None and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc) -> None:
            if getattr(self, "_intdet_idle", None) is not None:
                self._intdet_idle.cancel()
                self._intdet_idle = None
            super().connection_lost(exc)

    return IdleClosingProtocol
