"""A fifth backend for the tests: the backends API (python/intdet/backends/
__init__.py) in one module, with its own Model and State types over the C++
core, logging every call, so that a test can register it in the table (or
put it in place of ``intdet.webgpu.backend``) and see Engine, State, the
scheduler and hash-check run through it with model.py unchanged.

``REASON``: what ``available()`` answers (None: usable)."""

from __future__ import annotations

from intdet import _core

REASON = None
calls: list = []  # the API calls made, in order (name only)


def available():
    return REASON


class Model:
    def __init__(self, cfg, tensors, *, mapped=False, config_path="config.json", tensors_path="model.safetensors"):
        calls.append("Model")
        self.core = _core.Model(cfg, tensors, mapped=mapped, config_path=config_path, tensors_path=tensors_path)


class State:
    def __init__(self, model: Model, max_len: int):
        self.core = _core.State(model.core, max_len)

    def truncate(self, n):
        calls.append("truncate")
        self.core.truncate(n)

    def copy_prefix(self, src: "State", n):
        calls.append("copy_prefix")
        self.core.copy_prefix(src.core, n)


def forward(model, state, tokens, start, all_logits=False, out=None):
    calls.append("forward")
    return _core.forward(model.core, state.core, tokens, start, all_logits, out)


def forward_batch(model, states, tokens, all_logits=False, out=None):
    calls.append("forward_batch")
    return _core.forward_batch(model.core, [s.core for s in states], tokens, all_logits, out)


def forward_trace(model, state, tokens, start, isa=None):
    calls.append("forward_trace")
    return _core.forward_trace(model.core, state.core, tokens, start)


def kernels_ready():
    pass


def isa():
    return "fake"


def available_isas():
    return ["fake"]


def set_isa(name):
    raise ValueError("set_isa: not reached (the row has no set_isa capability)")


def set_num_threads(n):
    pass


def num_threads():
    return 1


def thread_setting():
    return 0


def last_forward_threads():
    return 1


def device_name():
    return "fake adapter"
