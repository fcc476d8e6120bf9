#!/usr/bin/env python3
"""Whether scripts/device-check.sh can run intdet's --device webgpu here, and
if not, why (issue 50: the webgpu rows run beside CUDA when intdet has them).

    python scripts/webgpu_ready.py [--require-gpu]

Prints one line: "ready: <adapter>" (exit 0), or the reason it is not
(exit 1): this intdet has no webgpu backend (intdet.webgpu), the backend
says it cannot run (the wgpu package missing, no adapter), or, with
--require-gpu, the only adapter is a CPU one (llvmpipe: the GPU's Vulkan
driver was not found, and its numbers would not be the GPU's)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys


def readiness(require_gpu: bool = False, find_spec=importlib.util.find_spec) -> tuple[bool, str]:
    """(True, adapter description) or (False, the one-line reason)."""
    if find_spec("intdet") is None:
        return False, "intdet is not importable"
    if find_spec("intdet.webgpu") is None or find_spec("intdet.backends") is None:
        return False, "this intdet has no webgpu backend (no intdet.webgpu / intdet.backends)"
    backends = importlib.import_module("intdet.backends")
    if "webgpu" not in backends.names():
        return False, "this intdet's backends table has no webgpu row"
    why = backends.availability("webgpu")
    if why:
        return False, why
    device = importlib.import_module("intdet.webgpu.device")
    adapter, _ = device.gpu()
    desc = device.adapter_name(adapter)
    if require_gpu and str(adapter.info.get("adapter_type", "")).upper() == "CPU":
        return False, (f"the only WebGPU adapter is a CPU one ({desc}): the GPU's Vulkan driver was not found "
                       "(carry the loaders in .gl/, set VK_DRIVER_FILES)")
    return True, desc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--require-gpu", action="store_true", help="a CPU adapter (llvmpipe) does not count")
    a = ap.parse_args(argv)
    ok, detail = readiness(a.require_gpu)
    print(f"ready: {detail}" if ok else detail)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
