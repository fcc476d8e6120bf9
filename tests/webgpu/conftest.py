"""WebGPU tests run where a WebGPU adapter opens (lavapipe in CI: Debian's
mesa-vulkan-drivers); elsewhere they are skipped with the reason."""

import pytest

from intdet.webgpu.device import available


def pytest_collection_modifyitems(config, items):
    ok, why = available()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"no WebGPU adapter: {why}")
    for item in items:
        if "tests/webgpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


@pytest.fixture(params=[False, True], ids=["dot4-shifts", "dot4-builtin"])
def dot4(request):
    """Both bodies of dot4_i8: the shift fallback, and dot4I8Packed where it compiles."""
    from intdet.webgpu.device import has_dot4

    if request.param and not has_dot4():
        pytest.skip("this adapter's WGSL has no dot4I8Packed")
    return request.param
