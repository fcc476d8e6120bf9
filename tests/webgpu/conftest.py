"""WebGPU tests run where a WebGPU adapter opens (lavapipe in CI: Debian's
mesa-vulkan-drivers); elsewhere they are skipped with the reason, unless
INTDET_REQUIRE_WEBGPU is set (.ci/run), where they fail instead."""

import os

import pytest

from intdet.webgpu.device import available


def pytest_collection_modifyitems(config, items):
    mine = [i for i in items if "tests/webgpu/" in str(i.fspath).replace("\\", "/")]
    if not mine:
        return
    ok, why = available()
    if ok:
        return
    if os.environ.get("INTDET_REQUIRE_WEBGPU"):
        raise pytest.UsageError(f"INTDET_REQUIRE_WEBGPU is set but there is no WebGPU adapter: {why}")
    skip = pytest.mark.skip(reason=f"no WebGPU adapter: {why}")
    for item in mine:
        item.add_marker(skip)


@pytest.fixture(params=[False, True], ids=["dot4-shifts", "dot4-builtin"])
def dot4(request):
    """Both bodies of dot4_i8: the shift fallback, and dot4I8Packed where it compiles."""
    from intdet.webgpu.device import has_dot4

    if request.param and not has_dot4():
        pytest.skip("this adapter's WGSL has no dot4I8Packed")
    return request.param
