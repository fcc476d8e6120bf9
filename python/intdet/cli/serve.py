"""``intdet serve``: the OpenAI-compatible server (serve/app.py) on uvicorn.

Binds to 127.0.0.1 unless --host says otherwise; --api-key (or
$INTDET_API_KEY) requires ``Authorization: Bearer KEY`` on every endpoint but
/health. SIGTERM or Ctrl-C: stop accepting connections (a request on a kept-alive
connection gets a 503), let running requests finish for up to
--drain-timeout seconds, then end every choice still running at once, from
the event loop, as a whole response with finish_reason "abort" (a stream's
last chunk and [DONE]; the text and hash of the tokens sent), whatever the
engine's step in flight, and exit 0 without waiting for that step. It prints one line ``intdet serve: listening on http://HOST:PORT
(model NAME)`` on stderr once it accepts connections (--port 0 picks a free
port, named there).
"""

from __future__ import annotations

import os
import sys

import click

from ..errors import IntdetError
from .errors import user_errors
from .options import _log, model_options, spec_draft_options, spec_settings

# Seconds after --drain-timeout before uvicorn cancels what is left: a
# backstop only, since the drain ends every choice at --drain-timeout.
DRAIN_BACKSTOP = 5


@click.command("serve")
@model_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback by default).")
@click.option("--port", default=8000, show_default=True, type=int, help="TCP port (0: any free port).")
@click.option("--max-batch", default=16, show_default=True, type=int, help="Sequences decoded together at most.")
@click.option("--step-tokens", default=512, show_default=True, type=int,
              help="Rows per forward call (decode rows + prefill chunks): the token budget of a step.")
@click.option("--kv-cache-mib", default=2048, show_default=True, type=int,
              help="KV cache memory for running sequences; requests beyond it wait in the queue.")
@click.option("--spec-ngram", "spec_ngram", default=0, show_default=True, type=click.IntRange(0, 64), metavar="K",
              help="Speculative decoding: up to K prompt-lookup drafts per decode step (the same outputs).")
@spec_draft_options
@click.option("--prefix-cache/--no-prefix-cache", default=True, show_default=True,
              help="Keep finished requests' KV for prompts that start with the same tokens (the same outputs).")
@click.option("--api-key", default=None, metavar="KEY",
              help="Require 'Authorization: Bearer KEY' (default: $INTDET_API_KEY; none = open).")
@click.option("--served-model-name", default=None, metavar="NAME",
              help="Model id in the API (default: the file name).")
@click.option("--max-connections", default=64, show_default=True, type=int,
              help="Concurrent connections; more get HTTP 503.")
@click.option("--max-body-mib", default=8, show_default=True, type=int, help="Largest request body.")
@click.option("--max-n", default=16, show_default=True, type=int, help="Largest n (choices per prompt).")
@click.option("--allow-weight-updates", is_flag=True,
              help="Take new weights on POST /v1/weights (a path on this machine or a safetensors body).")
@click.option("--max-weights-mib", default=2048, show_default=True, type=int,
              help="Largest safetensors body POST /v1/weights takes.")
@click.option("--drain-timeout", default=10, show_default=True, type=int,
              help="Seconds SIGTERM waits for running requests before cancelling them.")
@click.option("--idle-timeout", default=15, show_default=True, type=int,
              help="Seconds a new connection may take to send its first request before it is closed.")
@click.option("-v", "--verbose", is_flag=True, help="Log each HTTP request.")
@user_errors
def serve(model, revision, weights, device, threads, host, port, max_batch, step_tokens, kv_cache_mib, spec_ngram,
          spec_draft, spec_draft_max, prefix_cache, api_key, served_model_name, max_connections, max_body_mib, max_n,
          allow_weight_updates, max_weights_mib, drain_timeout, idle_timeout, verbose):
    """Serve the model over an OpenAI-compatible HTTP API (deterministic continuous batching)."""
    import asyncio
    import signal
    import socket

    try:
        import uvicorn

        from ..serve.app import Limits, create_app
        from ..serve.http import install_json_503, protocol_class
    except ImportError as e:
        raise IntdetError(f"intdet serve needs the serve extra: pip install 'intdet[serve]' ({e})") from None
    from ..api import LLM
    from ..resolve import resolve_source

    for name, v, lo in (("--port", port, 0), ("--max-batch", max_batch, 1), ("--step-tokens", step_tokens, 1),
                        ("--kv-cache-mib", kv_cache_mib, 1), ("--max-connections", max_connections, 1),
                        ("--max-body-mib", max_body_mib, 1), ("--max-n", max_n, 1), ("--max-weights-mib", max_weights_mib, 1),
                        ("--drain-timeout", drain_timeout, 0),
                        ("--idle-timeout", idle_timeout, 1)):
        if v < lo:
            raise IntdetError(f"{name}: {v} must be >= {lo}")
    spec_tokens, draft_model = spec_settings(spec_ngram, spec_draft, spec_draft_max)
    if port > 65535:
        raise IntdetError(f"--port: {port} must be <= 65535")
    if api_key is not None and not api_key.strip():
        raise IntdetError("--api-key: empty (an empty key would turn authentication off; omit the option instead)")
    api_key = api_key if api_key is not None else (os.environ.get("INTDET_API_KEY") or None)
    try:
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(fam, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except (OSError, OverflowError) as e:
        raise IntdetError(f"--host {host} --port {port}: cannot bind ({getattr(e, 'strerror', None) or e})") from None
    src = resolve_source(model, revision) if model is None or os.path.exists(model) else model
    name = served_model_name or os.path.basename(os.path.normpath(src or model or "intdet"))
    llm = LLM(model, device=device, threads=threads, weights=weights, revision=revision, max_batch=max_batch,
              step_tokens=step_tokens, kv_bytes=kv_cache_mib << 20, progress=sys.stderr.isatty(),
              notice=_log(True), spec_tokens=spec_tokens, prefix_cache=prefix_cache, draft_model=draft_model)
    app = create_app(llm, name, api_key, Limits(max_body_bytes=max_body_mib << 20, max_n=max_n,
                                             allow_weight_updates=allow_weight_updates,
                                             max_weights_bytes=max_weights_mib << 20))
    install_json_503()
    config = uvicorn.Config(app, http=protocol_class(idle_timeout), log_level="info" if verbose else "warning",
                            access_log=verbose,
                            # uvicorn counts the connection being checked: N + 1 lets N in
                            limit_concurrency=max_connections + 1,
                            timeout_graceful_shutdown=drain_timeout + DRAIN_BACKSTOP,
                            lifespan="on", server_header=False)
    server = uvicorn.Server(config)
    h, p = sock.getsockname()[:2]
    shown = f"[{h}]" if ":" in h else h

    orig_startup = server.startup

    async def startup(sockets=None):
        await orig_startup(sockets=sockets)
        click.echo(f"intdet serve: listening on http://{shown}:{p} (model {name}, "
                   f"{'API key required' if api_key else 'no API key'})", err=True)

    server.startup = startup
    orig_shutdown = server.shutdown
    srv = app.state.server

    def deadline():
        # Ends every choice still running on the event loop itself, from what
        # its client has received: an engine step in flight (a long prefill)
        # may outlast the drain, and uvicorn's hard cancel, which cuts
        # responses off, comes only DRAIN_BACKSTOP seconds later.
        n = srv.abort_all()
        llm.scheduler.cancel_all()
        if n:
            click.echo(f"intdet serve: drain timeout: {n} running choice(s) ended with finish_reason \"abort\"",
                       err=True)

    async def shutdown(sockets=None):
        srv.draining = True  # a request on a kept-alive connection gets a 503 from now on
        timer = asyncio.get_running_loop().call_later(drain_timeout, deadline)
        try:
            await orig_shutdown(sockets=sockets)
        finally:
            timer.cancel()

    server.shutdown = shutdown
    # uvicorn handles SIGINT/SIGTERM (stop accepting, drain, cancel) and, once
    # stopped, raises the signal again for the handler it found: make that
    # one record it, so a drained shutdown exits 0 instead of dying by it.
    got = []
    before = {s: signal.signal(s, lambda n, f: got.append(n)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    if getattr(server, "started", True) is False:
        raise IntdetError("the server did not start (see the lines above)")
    if got:
        click.echo(f"intdet serve: stopped ({signal.Signals(got[0]).name})", err=True)
    if llm.scheduler.busy:
        # Every response is answered; the engine thread is inside a forward
        # call that cannot be interrupted (its results are not wanted).
        # Leaving now without waiting for it, and without the interpreter's
        # teardown running beside native code still in flight.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
