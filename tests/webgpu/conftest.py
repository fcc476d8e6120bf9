"""WebGPU tests run where a WebGPU adapter opens (lavapipe in CI: Debian's
mesa-vulkan-drivers); elsewhere they are skipped with the reason, unless
INTDET_REQUIRE_WEBGPU is set (.ci/run), where they fail instead."""

import os

import pytest

from intdet.webgpu.device import available


@pytest.fixture(autouse=True)
def _webgpu_adapter():
    """Skip (or, under INTDET_REQUIRE_WEBGPU, fail) each test here without an adapter."""
    ok, why = available()
    if not ok:
        if os.environ.get("INTDET_REQUIRE_WEBGPU"):
            pytest.fail(f"INTDET_REQUIRE_WEBGPU is set but there is no WebGPU adapter: {why}")
        pytest.skip(f"no WebGPU adapter: {why}")


@pytest.fixture(params=[False, True], ids=["dot4-shifts", "dot4-builtin"])
def dot4(request):
    """Both bodies of dot4_i8: the shift fallback, and dot4I8Packed where it compiles."""
    from intdet.webgpu.device import has_dot4

    if request.param and not has_dot4():
        pytest.skip("this adapter's WGSL has no dot4I8Packed")
    return request.param
