import contextlib
import os
import sys

# tests/ holds the shared helpers (models.py, oracle.py, families.py, ...);
# the test files sit in folders that mirror python/intdet (tests/api/,
# tests/engine/, ...) and some import each other by basename (`from
# test_scheduler import ...`, `import test_cuda`), so every folder goes on the
# path too. Basenames stay unique across folders for that reason.
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
for _sub in sorted(os.listdir(TESTS_DIR), reverse=True):
    if _sub not in ("data", "fuzz") and os.path.isdir(os.path.join(TESTS_DIR, _sub)) and not _sub.startswith((".", "_")):
        sys.path.insert(0, os.path.join(TESTS_DIR, _sub))
sys.path.insert(0, TESTS_DIR)

import pytest  # noqa: E402

import models  # noqa: E402  (tests/models.py: deterministic tiny checkpoints)
from intdet import _core  # noqa: E402

# A suite started from a background job without job control (nohup, `cmd &`
# in a script, some CI runners) inherits SIGINT ignored, and an ignored
# signal stays ignored across exec: the interrupt tests' subprocesses then
# never see the Ctrl-C they send themselves. Catching it here (Python's own
# handler) leaves every child the default disposition again.
import signal  # noqa: E402

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def load_script(name: str):
    """scripts/NAME.py as a module (the scripts are not a package)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- every CPU kernel set (x thread count): the one definition the tests share

ISAS = _core.available_isas()  # this build's sets that this CPU runs
THREADS = (1, 2, 3)


@contextlib.contextmanager
def using_isa(isa, threads=None):
    """Run the block on kernel set `isa` (and `threads` threads), then restore
    the set and thread count that were active before."""
    before = (_core.isa(), _core.thread_setting())
    try:
        _core.set_isa(isa)
        if threads is not None:
            _core.set_num_threads(threads)
        yield
    finally:
        _core.set_isa(before[0])
        _core.set_num_threads(before[1])


@pytest.fixture(params=[(i, t) for i in ISAS for t in THREADS], ids=[f"{i}-{t}t" for i in ISAS for t in THREADS])
def isa_threads(request):
    """(isa, threads), active for the test: whole forwards, which split rows
    and channels across threads."""
    with using_isa(*request.param):
        yield request.param


@pytest.fixture(params=ISAS)
def isa(request):
    """The kernel set active for the test, each once: the _core.ops bindings
    run one thread, so only the set matters. Hypothesis tests using it
    suppress HealthCheck.function_scoped_fixture: the set is meant to stay
    for all their examples."""
    with using_isa(request.param):
        yield request.param


@pytest.fixture(scope="session")
def tiny_llama_hf(tmp_path_factory):
    """Path of a tiny LlamaForCausalLM checkpoint dir (float32, untied)."""
    return models.write_hf_model(str(tmp_path_factory.mktemp("tiny_llama_hf")), "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_hf(tmp_path_factory):
    """Path of a tiny Qwen2ForCausalLM checkpoint dir (q/k/v bias, tied)."""
    return models.write_hf_model(str(tmp_path_factory.mktemp("tiny_qwen2_hf")), "qwen2")


@pytest.fixture(scope="session")
def tiny_qwen3_hf(tmp_path_factory):
    """Path of a tiny Qwen3ForCausalLM checkpoint dir (q/k norm, tied)."""
    return models.write_hf_model(str(tmp_path_factory.mktemp("tiny_qwen3_hf")), "qwen3")


@pytest.fixture(scope="session")
def tiny_llama_gguf(tmp_path_factory):
    """Path of an F32 llama GGUF made from models.hf_twin_of_gguf("F32")
    (the same weights as tiny_llama_hf)."""
    return models.write_gguf_model(str(tmp_path_factory.mktemp("tiny_llama_gguf") / "tiny-llama-f32.gguf"), "F32")


@pytest.fixture(scope="session")
def tiny_gemma3_hf(tmp_path_factory):
    """Path of a tiny Gemma3ForCausalLM checkpoint dir (random_model.GEMMA3_TINY:
    local/global/local layers, window 5, post-norms, GeGLU, tied)."""
    return models.write_hf_model(str(tmp_path_factory.mktemp("tiny_gemma3_hf")), "gemma3")


# The WebGPU tests (tests/webgpu/) run where a WebGPU adapter opens (lavapipe
# in CI: Debian's mesa-vulkan-drivers); elsewhere each is skipped with the
# reason, unless INTDET_REQUIRE_WEBGPU is set (.ci/run), where it fails. Here,
# not in a tests/webgpu/conftest.py: a second conftest module would shadow
# this one for the tests that import names from it.
@pytest.fixture(autouse=True)
def _webgpu_adapter(request):
    if request.node.path.parent.name != "webgpu":
        return
    from intdet.webgpu.device import available

    ok, why = available()
    if not ok:
        if os.environ.get("INTDET_REQUIRE_WEBGPU"):
            pytest.fail(f"INTDET_REQUIRE_WEBGPU is set but there is no WebGPU adapter: {why}")
        pytest.skip(f"no WebGPU adapter: {why}")


@pytest.fixture(params=[False, True], ids=["dot4-shifts", "dot4-builtin"])
def dot4(request):
    """Both bodies of the WGSL dot4_i8: the shift fallback, and dot4I8Packed where it compiles."""
    from intdet.webgpu.device import has_dot4

    if request.param and not has_dot4():
        pytest.skip("this adapter's WGSL has no dot4I8Packed")
    return request.param
