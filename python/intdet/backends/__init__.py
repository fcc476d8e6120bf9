"""The backends table: device name -> the module that runs the model there.

Every backend module offers one API, the one ``intdet._core`` (C++) exposes
and ``intdet._cuda`` mirrors, so that ``model.Engine`` and ``model.State``
hold a backend object and never test the device name:

- ``Model(cfg, tensors, *, mapped=False, config_path="config.json",
  tensors_path="model.safetensors", **options)``: the model built on the
  backend (checked by the one loader: ValueError naming the file and tensor
  or key; RuntimeError for a device failure such as out of memory).
  ``options``: the backend's own settings (``cuda_graphs`` for cuda).
- ``State(model, max_len)``: one sequence's KV cache, with
  ``truncate(n)`` and ``copy_prefix(src_state, n)``.
- ``forward(model, state, tokens, start, all_logits=False, out=None)``:
  tokens int32 [T] at positions start..start+T-1 -> int32 logits [T or 1,
  V] (Q16), written into ``out`` when given (a writable C-contiguous int32
  array of that shape, else ValueError "out: ...").
- ``forward_batch(model, states, tokens_list, all_logits=False, out=None)``:
  several sequences in one call; all_logits one bool or one per sequence;
  one int32 array per sequence (views of ``out`` [rows, V] when given).
- ``device_name()``: the adapter's or GPU's name.
- optional, filled in when left out (one kernel set named after the
  backend, one host thread): ``kernels_ready()``, ``isa()``,
  ``available_isas()``, ``set_isa(name)`` (ValueError for an unknown set),
  ``set_num_threads(n)``, ``num_threads()``, ``thread_setting()``,
  ``last_forward_threads()``.
- optional: ``forward_trace(model, state, tokens, start, isa=None)`` ->
  (logits int32 [T, V], {name: int array} of the traced intermediates,
  kernel set used; Engine.trace says the backend has none without it), and
  ``submit_pick(model, state, tokens, start, **cuts)`` with
  ``wait_pick(model)`` (choosing tokens on the device; capability
  ``device_pick``).

Engine checks the context (n_past + T <= max_len) and the arguments'
types before calling, always passes ``all_logits`` to forward_batch as a
list of bools, and turns a ValueError from ``Model`` into an IntdetError
with its message and a RuntimeError into "device NAME: <message>".

A backend module is either that API itself (module-level functions, as
``intdet._core``) or has ``load()`` returning an object with it; it may
have ``available()`` answering ``None`` (usable here) or the one-line
reason it is not, or ``(ok, detail)`` (detail: the reason when not ok); it
is called on each load and listing, so it caches anything slow. Adding a
backend: one module, one ``Backend`` row in ``BACKENDS``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..errors import IntdetError


@dataclass(frozen=True)
class Backend:
    """One row of the table. ``module``: the dotted module implementing the
    API (imported on first use, so a missing optional one costs nothing
    until chosen). ``help``: the phrase ``--device`` help gives it.
    ``missing``: what the device error says when it cannot be used.
    Capabilities: ``device_pick`` (submit_pick / wait_pick), ``cuda_graphs``
    (the Model's ``cuda_graphs`` attribute and option), ``set_isa`` (more
    than one kernel set to switch between), ``trace`` (forward_trace),
    ``device_matrix`` (``intdet hash-check --device NAME`` runs its prefill
    splits and batches against a CPU run; cpu's own matrix is its kernel
    sets x threads, ref's is ``--ref``)."""

    name: str
    module: str
    help: str
    missing: str = "not available"
    device_pick: bool = False
    cuda_graphs: bool = False
    set_isa: bool = False
    trace: bool = True
    device_matrix: bool = False


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("cpu", "intdet.backends.cpu", "cpu (C++ core)", set_isa=True),
    Backend("cuda", "intdet.backends.cuda", "cuda (GPU, same bits)", missing="no CUDA GPU available",
            device_pick=True, cuda_graphs=True, device_matrix=True),
    Backend("ref", "intdet.ref.backend", "ref (numpy integer spec, slow)"),
    Backend("webgpu", "intdet.webgpu.backend", "webgpu (WebGPU adapter, same bits)",
            missing="no WebGPU adapter available", device_matrix=True),
)}


def names() -> tuple[str, ...]:
    """Every device name of the table, in its order (the CLI's --device choices)."""
    return tuple(BACKENDS)


def help_text(names_=None) -> str:
    """``--device`` help: each backend's phrase, "a, b or c" (all of the table by default)."""
    parts = [BACKENDS[n].help for n in (names_ or BACKENDS)]
    return ", ".join(parts[:-1]) + " or " + parts[-1] if len(parts) > 1 else parts[0]


def spec(name: str) -> Backend:
    """The table row of ``name``; IntdetError (field "device") for a name not in it."""
    if name not in BACKENDS:
        raise IntdetError(f"device {name!r} is not available (choose from {', '.join(BACKENDS)})", field="device")
    return BACKENDS[name]


def _import(b: Backend):
    """The backend's module; IntdetError (field "device") when it cannot be imported."""
    try:
        return importlib.import_module(b.module)
    except (ImportError, OSError) as e:  # OSError: a native library it loads at import is missing
        raise IntdetError(f"device {b.name}: {b.missing} ({b.module} cannot be imported: {e})",
                          field="device") from None


def _why_not(mod) -> str | None:
    """The module's ``available()`` as a reason or None; it may answer
    ``str | None`` or ``(ok, detail)`` (detail: why not when not ok)."""
    if not hasattr(mod, "available"):
        return None
    r = mod.available()
    if isinstance(r, tuple):
        ok, detail = r
        return None if ok else str(detail or "no reason given")
    return r or None


class _Defaults:
    """A backend API with the controls it left out answered as a device
    with one kernel set and no host threads does (the optional part of the
    API: kernels_ready, isa, available_isas, set_isa, the thread controls)."""

    def __init__(self, api, name: str):
        self._api, self._name = api, name

    def __getattr__(self, attr):  # only for names this class lacks: the backend's own first
        return getattr(self._api, attr)

    def __dir__(self):
        return sorted(set(dir(self._api)) | set(_OPTIONAL))


def _fill(attr: str):
    """A method of _Defaults for optional control ``attr``: the backend's
    own when it has one, else the default of a one-kernel-set device."""
    def call(self, *args):
        own = getattr(self._api, attr, None)
        if own is not None:
            return own(*args)
        if attr == "set_isa":
            raise ValueError(f"set_isa: the {self._name} backend has one kernel set")
        return {"isa": self._name, "available_isas": [self._name], "num_threads": 1, "thread_setting": 0,
                "last_forward_threads": 1}.get(attr)  # kernels_ready, set_num_threads: nothing to do

    call.__name__ = attr
    return call


_OPTIONAL = ("kernels_ready", "isa", "available_isas", "set_isa", "set_num_threads", "num_threads",
             "thread_setting", "last_forward_threads")
for _attr in _OPTIONAL:
    setattr(_Defaults, _attr, _fill(_attr))


def load(name: str):
    """The API object of backend ``name`` (see the module docstring), ready
    to build models; the optional controls a backend leaves out are filled
    in (_Defaults). IntdetError (field "device"), one line naming the
    device and why, for an unknown name, a module that cannot be imported
    or a backend whose ``available()`` gives a reason."""
    b = spec(name)
    mod = _import(b)
    why = _why_not(mod)
    if why:
        raise IntdetError(f"device {b.name}: {b.missing} ({why})", field="device")
    api = mod.load() if hasattr(mod, "load") else mod
    return api if all(hasattr(api, a) for a in _OPTIONAL) else _Defaults(api, b.name)


def availability(name: str) -> str | None:
    """None when backend ``name`` can run here, else the one-line error
    ``load`` would raise ("device NAME: ... (why)"), without raising or
    building anything (a listing: hash-check's other devices)."""
    try:
        b = spec(name)
        mod = _import(b)
    except IntdetError as e:
        return str(e)
    why = _why_not(mod)
    return f"device {b.name}: {b.missing} ({why})" if why else None


def matrix_devices() -> tuple[str, ...]:
    """The backends with the ``device_matrix`` capability (hash-check --device choices besides cpu)."""
    return tuple(n for n, b in BACKENDS.items() if b.device_matrix)
