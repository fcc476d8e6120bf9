"""Work that runs beside the main thread: ``Background`` (a function on a
thread, its result waited for later) and the sha256 of a file, which the
converter and the loader compute while they quantize or pack (hashlib
releases the GIL)."""

from __future__ import annotations

import hashlib
import threading


class Background:
    """fn(*args) computed on a thread from now on; ``result()`` waits for it
    (and raises what it raised). The source's sha256 reads every byte of a
    multi-GB checkpoint: it runs while the tensors are quantized (hashlib
    releases the GIL)."""

    def __init__(self, fn, *args):
        self._value, self._error = None, None

        def target():
            try:
                self._value = fn(*args)
            except BaseException as e:  # handed to result()
                self._error = e

        self._thread = threading.Thread(target=target, name="intdet-sha256", daemon=True)
        self._thread.start()

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def resolve_source(source: dict) -> dict:
    """A source description (convert.sources.FloatModel.source) with any
    Background value waited for."""
    return {k: (v.result() if isinstance(v, Background) else v) for k, v in source.items()}


def sha256_file(path, bufsize=1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()
