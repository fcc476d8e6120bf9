"""API-key authentication (``intdet serve --api-key``): the one check that
every guarded endpoint and the answer for an unknown path use."""

from __future__ import annotations

import hmac

from starlette.requests import Request
from starlette.responses import JSONResponse

from .common import error_response


def unauthorized(request: Request, api_key: str | None) -> JSONResponse | None:
    """The 401 answer when the server has an API key and ``request`` does not
    send it as ``Authorization: Bearer KEY`` (compared in constant time);
    None when the request may go on."""
    if api_key is None:
        return None
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
        return error_response(401, "missing or wrong API key (send 'Authorization: Bearer KEY')")
    return None
