"""``POST /v1/weights``: new weights for the served model (an RL trainer's
policy update), off unless ``intdet serve --allow-weight-updates``.

Two forms (SGLang's update_weights_from_disk and from a tensor body):
- JSON ``{"path": P}``: a .safetensors file, or a directory of them, on the
  server's disk, in Hugging Face names;
- a body of Content-Type ``application/octet-stream``: the bytes of one
  .safetensors file, at most ``--max-weights-mib``; spooled to a temporary
  file (removed after), then read as the path form.

LLM.update_weights does the rest (api.py): quantized as ``intdet convert``
would, on a worker thread (the event loop keeps serving); requests running
finish on the weights they started with, the waiting ones start after the
swap, the prefix cache is emptied. The answer: ``{"model_version": sha256,
"previous_version": sha256}``; a bad tensor is a 400 naming it, and the old
weights stay in force whole.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile

from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse

from ..errors import IntdetError
from .common import BadRequest

_log = logging.getLogger("intdet.serve")


class WeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str


async def update_weights(srv, request: Request):
    if not srv.limits.allow_weight_updates:
        raise BadRequest("weight updates are off on this server (start it with --allow-weight-updates)",
                         "path", status=403)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    spooled = None
    try:
        if ctype == "application/octet-stream":
            spooled = await _spool(srv, request)
            path = spooled
        else:
            path = (await srv.body(request, WeightsRequest)).path
            if not os.path.exists(path):
                raise BadRequest(f"path: {path!r} does not exist on the server", "path")
        try:
            async with _lock_of(srv):  # one update at a time: previous_version is the one it replaced
                before = srv.llm.model_version
                version = await asyncio.to_thread(srv.llm.update_weights, path)
        except IntdetError as e:
            msg = str(e).replace(spooled, "body") if spooled else str(e)
            _log.warning("POST /v1/weights refused: %s", msg)
            raise BadRequest(msg, e.field or "weights") from None
    finally:
        if spooled is not None:
            os.unlink(spooled)
    _log.warning("weights updated: model_version %s (was %s)", version, before)
    return JSONResponse({"model_version": version, "previous_version": before})


def _lock_of(srv) -> asyncio.Lock:
    lock = getattr(srv, "_weights_lock", None)
    if lock is None:
        lock = srv._weights_lock = asyncio.Lock()
    return lock


async def _spool(srv, request: Request) -> str:
    """The body into a temporary .safetensors file (size checked first and
    as it streams); its path."""
    limit = srv.limits.max_weights_bytes
    n = request.headers.get("content-length")
    if n is not None and (not n.isdigit() or int(n) > limit):
        raise BadRequest(f"body: larger than this server's --max-weights-mib ({limit >> 20} MiB)", "body", status=413)
    fd, path = tempfile.mkstemp(prefix="intdet-weights-", suffix=".safetensors")
    ok = False
    try:
        size = 0
        with os.fdopen(fd, "wb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise BadRequest(f"body: larger than this server's --max-weights-mib ({limit >> 20} MiB)",
                                     "body", status=413)
                f.write(chunk)
        if size == 0:
            raise BadRequest("body: empty (send the bytes of a .safetensors file)", "body")
        ok = True
        return path
    finally:
        if not ok:
            os.unlink(path)
