"""scripts/webgpu_ready.py: device-check.sh runs the webgpu rows only when
intdet has the backend and a (GPU) adapter, and prints why not otherwise."""

import importlib.util
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("webgpu_ready", os.path.join(HERE, "..", "..", "scripts", "webgpu_ready.py"))
ready = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ready)


def _found(*missing):
    return lambda name: None if name in missing else object()


def _fake(monkeypatch, why=None, adapter_type="DiscreteGPU", rows=("cpu", "cuda", "webgpu")):
    backends = types.SimpleNamespace(names=lambda: tuple(rows), availability=lambda name: why)
    adapter = types.SimpleNamespace(info={"device": "H100", "adapter_type": adapter_type, "backend_type": "Vulkan"})
    device = types.SimpleNamespace(gpu=lambda: (adapter, None),
                                   adapter_name=lambda a: f"{a.info['device']} (Vulkan, {a.info['adapter_type']})")
    monkeypatch.setitem(sys.modules, "intdet.backends", backends)
    monkeypatch.setitem(sys.modules, "intdet.webgpu.device", device)


def test_no_webgpu_backend_in_this_intdet():
    ok, why = ready.readiness(find_spec=_found("intdet.webgpu"))
    assert not ok and "no webgpu backend" in why


def test_backend_table_without_the_row(monkeypatch):
    _fake(monkeypatch, rows=("cpu", "cuda"))
    ok, why = ready.readiness(find_spec=_found())
    assert not ok and "no webgpu row" in why


def test_the_backends_own_reason_is_passed_on(monkeypatch):
    _fake(monkeypatch, why="device webgpu: no WebGPU adapter available (the wgpu package is not installed)")
    assert ready.readiness(find_spec=_found()) == (
        False, "device webgpu: no WebGPU adapter available (the wgpu package is not installed)")


def test_a_cpu_adapter_counts_only_without_require_gpu(monkeypatch):
    _fake(monkeypatch, adapter_type="CPU")
    assert ready.readiness(find_spec=_found()) == (True, "H100 (Vulkan, CPU)")
    ok, why = ready.readiness(require_gpu=True, find_spec=_found())
    assert not ok and "CPU one" in why and "VK_DRIVER_FILES" in why


def test_a_gpu_adapter_is_ready(monkeypatch):
    _fake(monkeypatch)
    assert ready.readiness(require_gpu=True, find_spec=_found()) == (True, "H100 (Vulkan, DiscreteGPU)")


def test_main_prints_one_line_and_exits_1_when_not_ready(monkeypatch, capsys):
    # whatever this checkout's intdet has: main() asks with a find_spec that finds no intdet.webgpu
    monkeypatch.setattr(ready.readiness, "__defaults__", (False, _found("intdet.webgpu")))
    assert ready.main([]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no webgpu backend" in out
