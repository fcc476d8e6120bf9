"""The cpu backend: the C++ core, ``intdet._core``, under the backends API
(backends/__init__.py): its functions as they are, plus the Model keywords,
``device_name`` and the host-memory preflight the API adds."""

from __future__ import annotations

from .. import _core
from .._core import (State, available_isas, check_model, forward, forward_batch, forward_trace, isa,  # noqa: F401
                     kernels_ready, last_forward_threads, num_threads, set_isa, set_num_threads, thread_setting)


def Model(cfg: dict, tensors: dict, *, mapped: bool = False, config_path: str = "config.json",
          tensors_path: str = "model.safetensors"):
    """``intdet._core.Model``: checked, packed for the active kernel set.
    mapped: the tensors view a read-only file mapping, so the core may drop
    each weight's pages once packed. ValueError naming the file."""
    return _core.Model(cfg, tensors, mapped=mapped, config_path=config_path, tensors_path=tensors_path)


def preflight(cfg: dict, tensors: dict, tensors_path: str) -> None:
    """Refuse (IntdetError) a model whose packing cannot fit in memory,
    before packing: a refusal rather than an OOM kill (preflight.py)."""
    from ..preflight import check_load

    check_load(cfg, tensors, tensors_path)


def device_name() -> str:
    return f"cpu ({_core.isa()})"
