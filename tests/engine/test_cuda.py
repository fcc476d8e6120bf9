"""The CUDA backend (csrc/cuda/, docs/cuda.md): the same logits as the CPU core, bit for bit.

Three layers, so that most of it runs on machines without a GPU:
- build checks: intdet._cuda imports (or, when it was not built, csrc/cuda/*.cu
  compile with nvcc) and its machine code has no floating-point instruction
  (scripts/check_sass.py; skipped without cuobjdump);
- the host emulator: the same CUDA sources built with g++ -DINTDET_CUDA_EMU
  (csrc/cuda/emu.h runs every CUDA thread as a fiber, with real barriers and
  warp shuffles) into a module _cuda_emu, compared op by op and model by model
  with intdet._core; it needs only g++ and pybind11;
- a real GPU (skipped when intdet._cuda sees none): the same comparisons, plus
  longer contexts, batches up to 256 and chain-hash equality of generations.
"""

from __future__ import annotations

import concurrent.futures
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import models
from intdet import _core as C
from intdet.convert import convert
from intdet.model import Engine, load_model
from intdet.ref import ops as R

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import check_sass  # noqa: E402

pytestmark = [pytest.mark.cuda, pytest.mark.slow]  # slow on CPU machines: the emulator builds and runs

CUDA_SRC = check_sass.CUDA_SRC


def _cuda_module():
    try:
        from intdet import _cuda
    except ImportError:
        return None
    return _cuda


CUDA = _cuda_module()
HAVE_GPU = CUDA is not None and CUDA.device_count() > 0
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU (or intdet built without intdet._cuda)")


# ------------------------------------------------------------------ build checks


def test_cuda_module_or_sources_compile(tmp_path):
    """With nvcc present the module must have been built; if it was not (built
    with -DINTDET_CUDA=OFF, say), the sources must still compile."""
    if CUDA is not None:
        assert isinstance(CUDA.device_count(), int)
        assert CUDA.isa() == "cuda"
        if not HAVE_GPU:
            assert CUDA.no_device_reason()
        return
    nvcc = check_sass.find_tool("nvcc")
    if not nvcc:
        pytest.skip("no nvcc and intdet._cuda not built")
    for src in check_sass.cuda_sources():
        cmd = [nvcc, "-std=c++20", "-O3", "-fmad=false", "-I", os.path.join(ROOT, "csrc", "include"),
               "-gencode", "arch=compute_90,code=sm_90", "-c", src,
               "-o", str(tmp_path / (os.path.basename(src) + ".o"))]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        assert r.returncode == 0, r.stderr[-3000:]


def test_sass_has_no_float_instruction():
    if not check_sass.tools_available():
        pytest.skip("cuobjdump/nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    if CUDA is not None:
        args = [CUDA.__file__]
    elif check_sass.find_tool("nvcc"):
        args = ["--compile"]
    else:
        pytest.skip("intdet._cuda not built and no nvcc")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "check_sass.py"), *args],
                       capture_output=True, text=True, timeout=1200, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "float opcodes: none" in r.stdout and "none found" in r.stdout


def test_sass_check_catches_float(tmp_path):
    """The checker itself: a kernel with one float multiply must fail it."""
    nvcc = check_sass.find_tool("nvcc")
    if not nvcc or not check_sass.tools_available():
        pytest.skip("needs nvcc and cuobjdump")
    src = tmp_path / "f.cu"
    src.write_text("__global__ void f(float* a) { a[threadIdx.x] *= 2.5f; }\n"
                   "__global__ void g(long long* a, long long b) { a[threadIdx.x] /= b; }\n")
    obj = tmp_path / "f.o"
    subprocess.run([nvcc, "-c", "-gencode", "arch=compute_90,code=sm_90", str(src), "-o", str(obj)], check=True,
                   timeout=600)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "check_sass.py"), str(obj)],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FMUL" in r.stdout and "MUFU" in r.stdout  # int64 '/' by a variable: a float reciprocal estimate


def test_sass_constant_move_idiom():
    """ptxas's "HFMA2.MMA Rn, -RZ, RZ, c, c'" (a constant into a register:
    -0 * 0 + c) counts as a move; every other HFMA2 form stays float."""
    line = "        /*19b0*/                   HFMA2.MMA R16, -RZ, RZ, 0, 0 ;    /* 0x00000000ff107435 */"
    assert check_sass.opcode_of(line) == check_sass.CONST_MOVE_OP
    assert check_sass.opcode_of(line.replace("0, 0 ;", "1.875, -0 ;")) == check_sass.CONST_MOVE_OP
    for other in ("HFMA2.MMA R16, -RZ, RZ, NAN, 0 ;", "HFMA2.MMA R16, R3, RZ, 0, 0 ;", "HFMA2 R4, R4, R5, R6 ;",
                  "HFMA2.MMA R16, -RZ, RZ, c[0x0][0x160], 0 ;", "@P0 HFMA2 R2, -RZ, RZ, R3, 0 ;"):
        assert check_sass.opcode_of(line.replace("HFMA2.MMA R16, -RZ, RZ, 0, 0 ;", other)) == "HFMA2", other
    assert check_sass.CONST_MOVE_OP not in check_sass.FLOAT_OPS


def test_floor_div_intonly_host():
    """The device's integer-only division (intmath.h udiv_u64), run on the
    host, against the spec's floor_div (ref/intmath.py)."""
    from intdet.ref.intmath import floor_div

    mod = CUDA or _emu_or_skip()
    rng = np.random.default_rng(7)
    a = np.concatenate([rng.integers(-2**62, 2**62, 3000), rng.integers(-1000, 1000, 3000),
                        np.array([0, 1, -1, 2**62 - 1, -(2**62), 2**63 - 1, -(2**63) + 1])]).astype(np.int64)
    b = np.concatenate([rng.integers(1, 2**62, 2000), rng.integers(1, 40, 2000), rng.integers(1, 2**31, 2000),
                        np.array([1, 1, 1, 3, 7, 1, 2**62])]).astype(np.int64)
    assert np.array_equal(mod.ops.floor_div_intonly(a, b), floor_div(a, b))


def test_no_driver_reason_says_so(monkeypatch):
    """Without a driver the runtime blames the driver's version; the reason
    says that no driver was found (a machine with a driver keeps the
    runtime's words)."""
    import intdet.backends.cuda as bc

    insufficient = "CUDA driver version is insufficient for CUDA runtime version"
    monkeypatch.setattr("os.path.exists", lambda p: False)
    assert bc._reason(insufficient).startswith("no NVIDIA driver found: /dev/nvidiactl is missing")
    assert bc._reason("") == "no device"
    monkeypatch.setattr("os.path.exists", lambda p: p == "/dev/nvidiactl")
    assert bc._reason(insufficient) == insufficient


def test_engine_cuda_without_gpu_is_one_clear_error(tmp_path_factory, tiny_llama_hf):
    if HAVE_GPU:
        pytest.skip("a GPU is present")
    from intdet.errors import IntdetError

    lm = load_model(convert(tiny_llama_hf, str(tmp_path_factory.mktemp("nogpu") / "m"), progress=False))
    with pytest.raises(IntdetError, match=r"^device cuda: no CUDA GPU available \(.+\)$"):
        Engine(lm, "cuda")


# ------------------------------------------------------------------ the host emulator

_EMU = {}


def _emu_sources():
    # every file of csrc/cuda (sources.txt's files, their headers, module.cpp, emu.h)
    paths = sorted(p for p in glob.glob(os.path.join(CUDA_SRC, "*")) if os.path.isfile(p))
    paths += [os.path.join(ROOT, "csrc", "include", "intdet", n)
              for n in ("intmath.h", "ops.h", "model.h", "layout.h", "loader.h", "trace.h", "kernels.h")]
    paths += [os.path.join(ROOT, "csrc", "model", n) for n in LOADER_SRC]  # the one model loader
    paths.append(os.path.join(ROOT, "csrc", "bindings", "model_bindings.h"))
    return paths


LOADER_SRC = ("layout.cpp", "loader.cpp", "pages.cpp")


def _nlohmann_include():
    try:
        import nlohmann_json
    except ImportError:
        raise RuntimeError("nlohmann-json not installed (pip install nlohmann-json)") from None
    return os.path.join(os.path.dirname(nlohmann_json.__file__), "include")


def build_emu_module():
    """Build _cuda_emu from csrc/cuda with g++ (cached in build/cuda-emu/<hash>);
    returns the imported module, or raises RuntimeError saying why not."""
    if "mod" in _EMU:
        return _EMU["mod"]
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if not cxx:
        raise RuntimeError("no C++ compiler")
    try:
        import pybind11
    except ImportError:
        raise RuntimeError("pybind11 not installed") from None
    h = hashlib.sha256()
    for p in _emu_sources():
        with open(p, "rb") as f:
            h.update(f.read())
    h.update(sys.version.encode())
    out = os.path.join(ROOT, "build", "cuda-emu", h.hexdigest()[:16])
    ext = sysconfig.get_config_var("EXT_SUFFIX")
    so = os.path.join(out, "_cuda_emu" + ext)
    if not os.path.isfile(so):
        os.makedirs(out, exist_ok=True)
        inc = ["-I", os.path.join(ROOT, "csrc", "include"), "-I", CUDA_SRC, "-isystem", _nlohmann_include()]
        base = [cxx, "-std=c++20", "-O2", "-fPIC", "-DINTDET_CUDA_EMU", *inc]
        kernels = check_sass.cuda_sources()  # csrc/cuda/sources.txt: the list CMake reads too
        kobjs = [os.path.basename(src) + ".o" for src in kernels]
        hosts = check_sass.host_sources()  # the engine's .cpp files
        jobs = [
            base + ["-D__CUDA_ARCH__=900", "-x", "c++", "-c", src, "-o", os.path.join(out, o)]
            for src, o in zip(kernels, kobjs)
        ] + [
            base + ["-c", src, "-o", os.path.join(out, os.path.basename(src) + ".o")] for src in hosts
        ] + [
            base + ["-fvisibility=hidden", "-DINTDET_CUDA_MODULE_NAME=_cuda_emu", "-I", sysconfig.get_paths()["include"],
                    "-I", pybind11.get_include(), "-c", os.path.join(CUDA_SRC, "module.cpp"), "-o", os.path.join(out, "m.o")],
        ] + [base + ["-c", os.path.join(ROOT, "csrc", "model", n), "-o", os.path.join(out, n + ".o")] for n in LOADER_SRC]
        # At most one compiler per CPU (the kernel files are several now).
        ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, ncpu)) as pool:
            runs = list(pool.map(lambda j: subprocess.run(j, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                          text=True, timeout=900, check=False), jobs))
        for r, j in zip(runs, jobs):
            if r.returncode:
                raise RuntimeError(f"emulator build failed: {' '.join(j)}\n{r.stdout[-3000:]}")
        tmp_so = so + ".tmp"
        objs = kobjs + [os.path.basename(src) + ".o" for src in hosts] + ["m.o"] + [n + ".o" for n in LOADER_SRC]
        subprocess.run([cxx, "-shared", "-o", tmp_so] + [os.path.join(out, n) for n in objs], check=True,
                       timeout=300)
        os.replace(tmp_so, so)
    import importlib.util

    spec = importlib.util.spec_from_file_location("_cuda_emu", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _EMU["mod"] = mod
    return mod


def _emu_or_skip():
    try:
        return build_emu_module()
    except RuntimeError as e:
        if os.environ.get("INTDET_REQUIRE_CUDA_EMU"):
            raise
        pytest.skip(str(e))


@pytest.fixture(scope="session", params=["emu", "gpu"])
def backend(request):
    """The module under test: the host emulator or the real GPU module."""
    if request.param == "gpu":
        if not HAVE_GPU:
            pytest.skip("no CUDA GPU")
        return CUDA
    return _emu_or_skip()


def is_emu(mod) -> bool:
    return mod.__name__.endswith("_cuda_emu")


# ------------------------------------------------------------------ ops, bit for bit against intdet._core.ops


def test_round_div(backend):
    rng = np.random.default_rng(1)
    a = np.concatenate([rng.integers(-2**61, 2**61, 3000), rng.integers(-500, 500, 1000)]).astype(np.int64)
    b = np.concatenate([rng.integers(1, 2**40, 1000), rng.integers(1, 300, 1000), rng.integers(2**30, 2**31, 2000)])
    b = b.astype(np.int64)
    assert np.array_equal(backend.ops.round_div(a, b), C.ops.round_div(a, b))


def test_round_div_edges(backend):
    """The device's reciprocal division (intmath.h DivBy) on test_fastdiv's
    edge divisors and numerators (powers of two and neighbours, 2^32 - 1,
    multiples d k and d k +- 1 up to int64's top, negatives) against the CPU."""
    from test_fastdiv import round_edge_pairs

    a_s, b_s = round_edge_pairs()
    a, b = np.array(a_s, np.int64), np.array(b_s, np.int64)
    got = backend.ops.round_div(a, b)
    assert np.array_equal(got, C.ops.round_div(a, b))
    assert got.tolist() == [(x + y // 2) // y for x, y in zip(a_s, b_s)]


def test_div_bench(backend):
    """scripts/bench_div.py's kernel: all four modes (udiv_u64 and DivBy, per
    element and per row) give the exact sums; bad arguments are refused."""
    rng = np.random.default_rng(3)
    a = np.concatenate([rng.integers(0, 2**62, 40), [0, 5, 2**62]]).astype(np.int64)
    b = np.concatenate([rng.integers(1, 2**31, 40), [1, 7, 2**62]]).astype(np.int64)
    reps = 3
    per_elem = [sum((x + r) // (d + r) for r in range(reps)) for x, d in zip(a.tolist(), b.tolist())]
    per_row = [sum((x + r) // d for r in range(reps)) for x, d in zip(a.tolist(), b.tolist())]
    for mode, want in ((0, per_elem), (1, per_elem), (2, per_row), (3, per_row)):
        sums, ns = backend.ops.div_bench(a, b, reps, mode)
        assert sums.tolist() == want, mode
        assert ns >= 0
    with pytest.raises(ValueError, match="div_bench"):
        backend.ops.div_bench(a, b, reps, 4)
    with pytest.raises(ValueError, match="div_bench"):
        backend.ops.div_bench(a, np.zeros_like(b), reps, 0)


LINEAR_SHAPES = [(1, 72, 40), (2, 64, 33), (3, 48, 5), (8, 136, 70), (13, 256, 65), (32, 96, 64), (40, 72, 130),
                 (70, 96, 64), (65, 160, 129)]


@pytest.mark.parametrize("T,K,N", LINEAR_SHAPES)
def test_linear(backend, T, K, N):
    rng = np.random.default_rng(T * 1000 + K + N)
    q = rng.integers(-32767, 32768, size=(T, K)).astype(np.int16)
    e = rng.integers(0, 24, size=T).astype(np.int32)
    w = rng.integers(-127, 128, size=(N, K)).astype(np.int8)
    mant = rng.integers(0, 2**15 + 1, size=N).astype(np.int32)
    shift = rng.integers(-8, 60, size=N).astype(np.int32)
    want = C.ops.linear(q, e, w, mant, shift)
    for path in (0, 1, 2, 3):
        assert np.array_equal(backend.ops.linear(q, e, w, mant, shift, None, path), want), path
    bias = rng.integers(-2**31 + 1, 2**31, size=N).astype(np.int32)
    want_b = np.clip(want + bias, -(2**31 - 1), 2**31 - 1)
    assert np.array_equal(backend.ops.linear(q, e, w, mant, shift, bias, 0), want_b)


@pytest.mark.parametrize("K", [4096, 4104])
def test_linear_extreme_sums(backend, K):
    """All-maximal products: the exact sum needs int64; partial sums must not overflow int32."""
    T, N = 3, 6
    q = np.full((T, K), 32767, np.int16)
    q[1] = -32767
    w = np.full((N, K), 127, np.int8)
    w[::2] = -127
    e = np.zeros(T, np.int32)
    mant = np.full(N, 1 << 15, np.int32)
    shift = np.full(N, 40, np.int32)
    want = C.ops.linear(q, e, w, mant, shift)
    for path in (1, 2, 3):
        assert np.array_equal(backend.ops.linear(q, e, w, mant, shift, None, path), want), path


def test_linear_mma_k_chunks(backend):
    """The tensor-core GEMM's s32 sums go into int64 every 32768 inputs: with
    all-maximal low bytes (x = 32767: lo = 255, hi = 127; w = +-127) a K of
    66000 would leave s32 (66000 * 255 * 127 > 2^31; the emulator aborts on
    an s32 overflow) without that flush."""
    T, N, K = 2, 8, 66000
    q = np.full((T, K), 32767, np.int16)
    q[1] = -32768
    w = np.full((N, K), 127, np.int8)
    w[1::2] = -127
    e = np.zeros(T, np.int32)
    mant = np.full(N, 1 << 15, np.int32)
    shift = np.full(N, 48, np.int32)
    want = C.ops.linear(q, e, w, mant, shift)
    assert np.array_equal(backend.ops.linear(q, e, w, mant, shift, None, 2), want)


@given(T=st.integers(33, 150), K=st.integers(1, 200), N=st.integers(1, 150), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_linear_mma_hypothesis(backend, T, K, N, seed):
    """The IMMA GEMM (int16 split into s8 hi and u8 lo, mma.sync m16n8k32,
    the PTX fragment layout emulated lane by lane in emu.h) against the CPU
    linear for shapes across the 64 x 64 x 64 tile edges, K % 16 == 0 (16-byte
    loads) or not (element loads), the full int16 range including -32768."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-32768, 32768, size=(T, K)).astype(np.int16)
    q[0] = -32768
    e = rng.integers(0, 24, size=T).astype(np.int32)
    w = rng.integers(-127, 128, size=(N, K)).astype(np.int8)
    mant = rng.integers(0, 2**15 + 1, size=N).astype(np.int32)
    shift = rng.integers(-8, 60, size=N).astype(np.int32)
    bias = rng.integers(-2**31 + 1, 2**31, size=N).astype(np.int32) if seed % 2 else None
    want = C.ops.linear(q, e, w, mant, shift)
    if bias is not None:
        want = np.clip(want + bias, -(2**31 - 1), 2**31 - 1)
    assert np.array_equal(backend.ops.linear(q, e, w, mant, shift, bias, 2), want)


@pytest.mark.parametrize("T,K,N", [(1, 1024, 40), (3, 4096, 9), (8, 2064, 13), (1, 8192, 6)])
def test_linear_gemv_split_k(backend, T, K, N):
    """The GEMV's split-K (1, 2 or 4 warps per channel, int64 parts through
    shared memory) and its unrolled 16-byte loads give the exact sums."""
    rng = np.random.default_rng(T + K + N)
    q = rng.integers(-32767, 32768, size=(T, K)).astype(np.int16)
    q[0, : K // 2] = 32767
    e = rng.integers(0, 24, size=T).astype(np.int32)
    w = rng.integers(-127, 128, size=(N, K)).astype(np.int8)
    w[0] = 127
    mant = rng.integers(0, 2**15 + 1, size=N).astype(np.int32)
    shift = rng.integers(20, 60, size=N).astype(np.int32)
    want = C.ops.linear(q, e, w, mant, shift)
    try:
        for wlg in (0, 1, 2, -1):
            backend.ops.set_gemv_split(wlg)
            assert np.array_equal(backend.ops.linear(q, e, w, mant, shift, None, 1), want), wlg
    finally:
        backend.ops.set_gemv_split(-1)


# (M, K, N): K a multiple of 64, of 16 only (16-byte cp.async, a partial last
# K tile), or neither (element staging); K of 1..5 tiles across the
# three-stage pipeline's prologue; M across the 16 / 32 / 64-row block tiles,
# the GEMV cut and prefill sizes (auto takes it for every T > 8); N across
# the 64-channel tiles.
SKINNY_SHAPES = [(9, 64, 40), (16, 1040, 70), (17, 72, 33), (64, 512, 64), (100, 200, 130), (256, 272, 96),
                 (40, 136, 20), (300, 320, 70), (520, 96, 130)]


@pytest.mark.parametrize("M,K,N", SKINNY_SHAPES)
def test_linear_skinny(backend, M, K, N):
    """The skinny IMMA GEMM (path 4; auto for more than 8 rows):
    the CPU linear bit for bit, unsplit and split-K (int64 partials through
    the scratch, the last split's epilogue), with bias, and in residual mode
    (out = sat32(out + linear), the o / down-proj store) near int32's ends.
    The op also checks that the split-K scratch is left zero."""
    rng = np.random.default_rng(M * 7919 + K * 31 + N)
    q = rng.integers(-32768, 32768, size=(M, K)).astype(np.int16)
    q[0] = -32768
    q[-1, : K // 2] = 32767
    e = rng.integers(0, 24, size=M).astype(np.int32)
    w = rng.integers(-127, 128, size=(N, K)).astype(np.int8)
    w[0] = 127
    mant = rng.integers(0, 2**15 + 1, size=N).astype(np.int32)
    shift = rng.integers(-8, 60, size=N).astype(np.int32)
    bias = rng.integers(-2**31 + 1, 2**31, size=N).astype(np.int32)
    want = C.ops.linear(q, e, w, mant, shift)
    want_b = np.clip(want + bias, -(2**31 - 1), 2**31 - 1)
    res = rng.integers(-2**31 + 1, 2**31, size=(M, N)).astype(np.int32)
    want_r = np.clip(res.astype(np.int64) + want_b, -(2**31 - 1), 2**31 - 1)
    try:
        for splits in (0, 1, 3):
            backend.ops.set_skinny_split(splits)
            assert np.array_equal(backend.ops.linear(q, e, w, mant, shift, None, 4), want), splits
            assert np.array_equal(backend.ops.linear(q, e, w, mant, shift, bias, 4), want_b), splits
            assert np.array_equal(backend.ops.linear(q, e, w, mant, shift, bias, 4, res), want_r), splits
        backend.ops.set_skinny_split(0)
        assert np.array_equal(backend.ops.linear(q, e, w, mant, shift, bias, 0, res), want_r)  # auto
    finally:
        backend.ops.set_skinny_split(0)


def test_linear_skinny_k_chunks(backend):
    """One unsplit block over K = 66000 all-maximal inputs: the s32 hi / lo
    sums must go into int64 every 32768 inputs (the emulator aborts on an s32
    overflow); split, the int64 partials add up to the same sums."""
    T, N, K = 9, 8, 66000
    q = np.full((T, K), 32767, np.int16)
    q[1] = -32768
    w = np.full((N, K), 127, np.int8)
    w[1::2] = -127
    e = np.zeros(T, np.int32)
    mant = np.full(N, 1 << 15, np.int32)
    shift = np.full(N, 48, np.int32)
    want = C.ops.linear(q, e, w, mant, shift)
    try:
        for splits in (1, 0):
            backend.ops.set_skinny_split(splits)
            assert np.array_equal(backend.ops.linear(q, e, w, mant, shift, None, 4), want), splits
    finally:
        backend.ops.set_skinny_split(0)


def _int4_weights(rng, N, K):
    """Random int4 layer (codes, step, offset) inside the loader's bound
    0 <= gd, |gm| <= 2047, gm + 15 gd <= 2047."""
    G = K // 32
    w4 = rng.integers(0, 256, size=(N, K // 2)).astype(np.uint8)
    gd = rng.integers(0, 273, size=(N, G)).astype(np.int16)
    gm = rng.integers(-2047, 2048 - 15 * gd.astype(np.int64)).astype(np.int16)
    return w4, gd, gm


LINEAR_W4_SHAPES = [(1, 32, 5), (2, 64, 33), (3, 96, 40), (8, 160, 70), (13, 256, 65), (32, 96, 64), (40, 64, 130),
                    (70, 128, 64), (65, 1088, 129)]


@pytest.mark.parametrize("T,K,N", LINEAR_W4_SHAPES)
def test_linear_w4(backend, T, K, N):
    """Int4 linear on both paths against the spec (linear on dequant_int4 weights)."""
    rng = np.random.default_rng(T * 1000 + K + N + 7)
    q = rng.integers(-32768, 32768, size=(T, K)).astype(np.int16)
    e = rng.integers(0, 24, size=T).astype(np.int32)
    w4, gd, gm = _int4_weights(rng, N, K)
    mant = rng.integers(0, 2**15 + 1, size=N).astype(np.int32)
    shift = rng.integers(-8, 60, size=N).astype(np.int32)
    w = R.dequant_int4(w4, gd, gm)
    assert np.abs(w).max() <= 2047
    want = R.linear(q, e, w, mant, shift)
    for path in (0, 1, 2):
        assert np.array_equal(backend.ops.linear_w4(q, e, w4, gd, gm, mant, shift, None, path), want), path
    bias = rng.integers(-2**31 + 1, 2**31, size=N).astype(np.int32)
    want_b = R.linear(q, e, w, mant, shift, bias)
    for path in (1, 2):
        assert np.array_equal(backend.ops.linear_w4(q, e, w4, gd, gm, mant, shift, bias, path), want_b), path


@pytest.mark.parametrize("K", [1088, 1120])
def test_linear_w4_extreme_sums(backend, K):
    """q = -32768 / 32767 against w = +-2047 (from gd = 0, gm = +-2047, and from
    codes 15 at gd = 1, gm = 2032, or codes 0 at gm = -2047 with gd = 272): the
    exact sums need int64; the per-group int32 sums must not overflow."""
    T, N = 4, 6
    G = K // 32
    q = np.full((T, K), 32767, np.int16)
    q[1] = -32768
    q[2, ::2] = -32768
    q[3] = np.where(np.arange(K) % 3 == 0, -32768, 32767)
    w4 = np.zeros((N, K // 2), np.uint8)
    gd = np.zeros((N, G), np.int16)
    gm = np.zeros((N, G), np.int16)
    gm[0] = 2047                                  # all +2047 (codes 0)
    w4[1], gm[1] = 0xFF, -2047                    # all -2047 (gd 0, codes ignored)
    w4[2], gd[2], gm[2] = 0xFF, 1, 2032           # codes 15: 15 + 2032 = 2047
    w4[3], gd[3], gm[3] = 0x00, 272, -2047        # codes 0: -2047 (15 * 272 - 2047 = 2033)
    w4[4], gd[4], gm[4] = 0xF0, 272, -2047        # alternating -2047, 2033
    w4[5], gd[5], gm[5] = 0x0F, 1, 2032           # alternating 2047, 2032
    w = R.dequant_int4(w4, gd, gm)
    assert np.abs(w).max() == 2047
    e = np.zeros(T, np.int32)
    mant = np.full(N, 1 << 15, np.int32)
    shift = np.full(N, 40, np.int32)
    want = R.linear(q, e, w, mant, shift)
    for path in (1, 2):
        assert np.array_equal(backend.ops.linear_w4(q, e, w4, gd, gm, mant, shift, None, path), want), path


@pytest.mark.parametrize("n,D", [(1, 48), (37, 48), (300, 64), (600, 32), (1100, 128), (1030, 256), (5, 30)])
def test_attend(backend, n, D):
    rng = np.random.default_rng(n + D)
    q = rng.integers(-2**30, 2**30, size=D).astype(np.int32)
    kc = rng.integers(-127, 128, size=(n, D)).astype(np.int8)
    vc = rng.integers(-127, 128, size=(n, D)).astype(np.int8)
    ka = rng.integers(0, 2**31 - 1, size=n).astype(np.int32)
    va = rng.integers(0, 2**31 - 1, size=n).astype(np.int32)
    for sm, ss in ((23456, 40), (32768, 52), (1, 0)):
        qq, qe = C.ops.quant16(q.astype(np.int64))
        want = C.ops.attend(qq.astype(np.int16), int(qe[0]), kc, ka, vc, va, sm, ss)
        assert np.array_equal(backend.ops.attend(q, kc, ka, vc, va, sm, ss), want)


def test_attend_flat_scores_max_values(backend):
    """Equal scores over > 512 positions with v = 127: value weights all at
    their maximum, so the int32 P.V blocks are at their bound."""
    n, D = 1500, 64
    q = np.zeros(D, np.int32)
    kc = np.zeros((n, D), np.int8)
    vc = np.full((n, D), 127, np.int8)
    vc[:, ::3] = -127
    ka = np.full(n, 1000, np.int32)
    va = np.full(n, 2**31 - 1, np.int32)
    qq, qe = C.ops.quant16(q.astype(np.int64))
    want = C.ops.attend(qq.astype(np.int16), int(qe[0]), kc, ka, vc, va, 23456, 40)
    assert np.array_equal(backend.ops.attend(q, kc, ka, vc, va, 23456, 40), want)


@pytest.mark.parametrize("n,nh,nkv,D,chunk", [(1, 2, 1, 64, 0), (100, 4, 2, 128, 32), (700, 6, 2, 48, 96),
                                                (1030, 4, 4, 256, 512), (513, 8, 2, 30, 64), (77, 16, 1, 16, 0),
                                                (2000, 2, 1, 128, 0)])
def test_attend_gqa_split(backend, n, nh, nkv, D, chunk):
    """Flash-decoding split over positions, one block per (chunk, kv head) for
    all its query heads: every head's bits are the CPU's attend_head, whatever
    the chunk (1 to 63 chunks here, scalar D = 30, 16-byte paths otherwise)."""
    rng = np.random.default_rng(n * 7 + nh + D)
    q = rng.integers(-2**30, 2**30, size=(nh, D)).astype(np.int32)
    q[0, :] = 0  # an all-zero head: flat scores
    kc = rng.integers(-127, 128, size=(n, nkv, D)).astype(np.int8)
    vc = rng.integers(-127, 128, size=(n, nkv, D)).astype(np.int8)
    ka = rng.integers(0, 2**31 - 1, size=(n, nkv)).astype(np.int32)
    va = rng.integers(0, 2**31 - 1, size=(n, nkv)).astype(np.int32)
    got = backend.ops.attend_gqa(q, kc, ka, vc, va, 23456, 40, chunk)
    grp = nh // nkv
    for h in range(nh):
        kvh = h // grp
        qq, qe = C.ops.quant16(q[h].astype(np.int64))
        want = C.ops.attend(qq.astype(np.int16), int(qe[0]), np.ascontiguousarray(kc[:, kvh]),
                            np.ascontiguousarray(ka[:, kvh]), np.ascontiguousarray(vc[:, kvh]),
                            np.ascontiguousarray(va[:, kvh]), 23456, 40)
        assert np.array_equal(got[h], want), h


def test_attend_gqa_checks_its_arguments(backend):
    z8 = np.zeros((4, 2, 16), np.int8)
    z32 = np.zeros((4, 2), np.int32)
    with pytest.raises(ValueError, match="chunk"):
        backend.ops.attend_gqa(np.zeros((2, 16), np.int32), z8, z32, z8, z32, 1, 0, 513)
    with pytest.raises(ValueError, match="shape"):
        backend.ops.attend_gqa(np.zeros((3, 16), np.int32), z8, z32, z8, z32, 1, 0, 0)


def _attend_rows_want(q, kc, ka, vc, va, pos, window, sm, ss):
    """The CPU's attend_head per (row, head) over the row's positions."""
    T, nh, D = q.shape
    nkv = kc.shape[1]
    grp = nh // nkv
    want = np.zeros((T, nh, D), np.int64)
    for t in range(T):
        p = int(pos[t])
        lo = p + 1 - window if window and p + 1 > window else 0
        for h in range(nh):
            kvh = h // grp
            qq, qe = C.ops.quant16(q[t, h].astype(np.int64))
            want[t, h] = C.ops.attend(qq.astype(np.int16), int(qe[0]), np.ascontiguousarray(kc[lo:p + 1, kvh]),
                                      np.ascontiguousarray(ka[lo:p + 1, kvh]), np.ascontiguousarray(vc[lo:p + 1, kvh]),
                                      np.ascontiguousarray(va[lo:p + 1, kvh]), sm, ss)
    return want


# (T rows, start position, nh, nkv, D, window): contexts across the 64-key
# steps and the 16-row tiles, GQA groups 1..16 (3: tiles of 15 rows), a
# prefill split (start > 0), sliding windows, D % 32 != 0 and the scalar D = 30.
ATTEND_ROWS = [(40, 0, 2, 1, 64, 0), (33, 31, 3, 1, 48, 0), (70, 130, 4, 2, 128, 0), (17, 0, 16, 1, 16, 0),
               (35, 60, 6, 3, 30, 0), (50, 20, 2, 2, 256, 0), (45, 100, 4, 1, 32, 37), (20, 5, 1, 1, 96, 9)]


@pytest.mark.parametrize("path", [2, 4])
@pytest.mark.parametrize("T,start,nh,nkv,D,window", ATTEND_ROWS)
def test_attend_rows_tensor_cores(backend, T, start, nh, nkv, D, window, path):
    """Prefill attention on the tensor cores, both shapes: attn_mma_kernel
    (path 2: 16-row tiles, a score scratch) and attn_flash_kernel (path 4:
    128-row tiles, QK^T recomputed per softmax pass, the C fragments as
    P.V's A fragments): every (row, head) is the CPU's attend_head, bit for
    bit, and the same as the flash-decoding split path; act / act_e are
    quant16 of each row."""
    rng = np.random.default_rng(T * 31 + start + nh + D)
    n = start + T
    pos = np.arange(start, n, dtype=np.int32)
    q = rng.integers(-2**30, 2**30, size=(T, nh, D)).astype(np.int32)
    q[0, 0, :] = 0  # an all-zero head: flat scores
    q[-1, -1, :] = -2**31 + 1
    kc = rng.integers(-127, 128, size=(n, nkv, D)).astype(np.int8)
    vc = rng.integers(-127, 128, size=(n, nkv, D)).astype(np.int8)
    ka = rng.integers(0, 2**31 - 1, size=(n, nkv)).astype(np.int32)
    va = rng.integers(0, 2**31 - 1, size=(n, nkv)).astype(np.int32)
    want = _attend_rows_want(q, kc, ka, vc, va, pos, window, 23456, 40)
    out, act, act_e = backend.ops.attend_rows(q, kc, ka, vc, va, pos, window, 23456, 40, path)
    assert np.array_equal(out, want)
    for t in range(T):
        wq, we = C.ops.quant16(want[t].reshape(-1))
        assert np.array_equal(act[t], wq) and act_e[t] == we[0], t
    out1, act1, e1 = backend.ops.attend_rows(q, kc, ka, vc, va, pos, window, 23456, 40, 1)
    assert np.array_equal(out1, out) and np.array_equal(act1, act) and np.array_equal(e1, act_e)


@pytest.mark.parametrize("path", [2, 4])
def test_attend_rows_tensor_cores_extremes(backend, path):
    """Maximal value weights (flat scores) and |v| = 127 over 700 keys per row,
    queries at the int16 bound (hi bytes -128 / 127, lo bytes 255): the s32
    hi / lo sums at their largest, still the CPU's bits."""
    T, nh, nkv, D, n = 34, 2, 1, 64, 700
    pos = np.arange(n - T, n, dtype=np.int32)
    q = np.full((T, nh, D), 2**30, np.int32)
    q[:, 1, ::2] = -2**30
    kc = np.full((n, nkv, D), 127, np.int8)
    kc[:, :, 1::3] = -127
    vc = np.full((n, nkv, D), 127, np.int8)
    vc[:, :, ::3] = -127
    ka = np.full((n, nkv), 1000, np.int32)
    va = np.full((n, nkv), 2**31 - 1, np.int32)
    want = _attend_rows_want(q, kc, ka, vc, va, pos, 0, 23456, 40)
    out, _, _ = backend.ops.attend_rows(q, kc, ka, vc, va, pos, 0, 23456, 40, path)
    assert np.array_equal(out, want)


def test_attend_rows_flash_flushes_past_32768_keys(backend):
    """The flash tiles' P.V sums go from s32 into int64 every 32768 keys (a
    sum stays exact for 65536): 66000 keys with every value weight at its
    maximum (flat scores: hi byte 127, lo byte 255) and |v| = 127 take two
    flushes, whose parts differ, so a lost or doubled part changes the
    result; still the CPU's bits."""
    T, nh, nkv, D, n = 2, 1, 1, 32, 66000
    pos = np.array([n - 2, n - 1], np.int32)
    q = np.full((T, nh, D), 2**30, np.int32)
    kc = np.full((n, nkv, D), 127, np.int8)
    vc = np.full((n, nkv, D), 127, np.int8)
    vc[:, :, ::3] = -127
    vc[40000:, :, 1] = 3  # the second flush's part differs from the first's
    ka = np.full((n, nkv), 1000, np.int32)
    va = np.full((n, nkv), 2**31 - 1, np.int32)
    want = _attend_rows_want(q, kc, ka, vc, va, pos, 0, 23456, 40)
    out, _, _ = backend.ops.attend_rows(q, kc, ka, vc, va, pos, 0, 23456, 40, 4)
    assert np.array_equal(out, want)


def test_attend_rows_checks_its_arguments(backend):
    z8 = np.zeros((4, 2, 16), np.int8)
    z32 = np.zeros((4, 2), np.int32)
    q = np.zeros((2, 2, 16), np.int32)
    with pytest.raises(ValueError, match="pos"):
        backend.ops.attend_rows(q, z8, z32, z8, z32, np.array([0, 4], np.int32), 0, 1, 0, 2)
    with pytest.raises(ValueError, match="shape"):
        backend.ops.attend_rows(np.zeros((2, 3, 16), np.int32), z8, z32, z8, z32, np.array([0, 1], np.int32), 0, 1, 0)
    with pytest.raises(ValueError, match="path"):
        backend.ops.attend_rows(q, z8, z32, z8, z32, np.array([0, 1], np.int32), 0, 1, 0, 5)


def _attend_rows_case(T, start, nh, nkv, D, seed):
    """Random rows T at positions start..start+T-1 over a cache of start+T
    positions: q with an all-zero head (flat scores) and one at the int32
    bound. Key scales below 64 keep the scores within some 2^20 of each other
    (a few units of log2: weights spread over many positions); with scales up
    to 2^31 most scores saturate and the softmax is one flat top."""
    rng = np.random.default_rng(seed)
    n = start + T
    pos = np.arange(start, start + T, dtype=np.int32)
    q = rng.integers(-2**30, 2**30, size=(T, nh, D)).astype(np.int32)
    q[0, 0, :] = 0
    q[-1, -1, :] = -2**31 + 1
    kc = rng.integers(-127, 128, size=(n, nkv, D)).astype(np.int8)
    vc = rng.integers(-127, 128, size=(n, nkv, D)).astype(np.int8)
    ka = rng.integers(1, 64, size=(n, nkv)).astype(np.int32)
    va = rng.integers(0, 2**31 - 1, size=(n, nkv)).astype(np.int32)
    return q, kc, ka, vc, va, pos


# (T rows, start position, nh, nkv, D, window): one position, a few, the
# 16-byte paths from one lane per position (D = 16) to sixteen (D = 256), the
# scalar D = 30 and D = 48 (three of four lanes), GQA groups 1, 2, 3, 4, 8, 16
# (odd groups: a P.V pair with one head), sliding windows, contexts up to the
# one-kernel path's bound for the group (attn_fused_max_pos: 2048, 1536 for 4,
# 768 for 8, 384 for 16).
ATTEND_FUSED = [(1, 0, 2, 1, 64, 0), (3, 0, 4, 2, 128, 0), (2, 5, 3, 1, 48, 0), (1, 99, 16, 1, 16, 0),
                (4, 30, 6, 3, 30, 0), (2, 300, 8, 1, 256, 0), (1, 700, 4, 4, 32, 0), (3, 50, 8, 2, 64, 17),
                (1, 2047, 2, 1, 128, 0), (1, 1535, 4, 1, 64, 0), (2, 382, 16, 1, 32, 0), (2, 900, 2, 2, 96, 300)]


@pytest.mark.parametrize("T,start,nh,nkv,D,window", ATTEND_FUSED)
def test_attend_rows_one_kernel(backend, T, start, nh, nkv, D, window):
    """Decode attention in one launch (attn_fused_kernel, path 3: a block per
    (row, kv head), the group's scores and the three-pass softmax in shared
    memory, the row's quant16 by its last block): every (row, head) is the
    CPU's attend_head and act / act_e the CPU's quant16 of each row, bit for
    bit, and the same as the flash-decoding split (path 1)."""
    q, kc, ka, vc, va, pos = _attend_rows_case(T, start, nh, nkv, D, T * 31 + start + nh + D)
    want = _attend_rows_want(q, kc, ka, vc, va, pos, window, 23456, 40)
    out, act, act_e = backend.ops.attend_rows(q, kc, ka, vc, va, pos, window, 23456, 40, 3)
    assert np.array_equal(out, want)
    for t in range(T):
        wq, we = C.ops.quant16(want[t].reshape(-1))
        assert np.array_equal(act[t], wq) and act_e[t] == we[0], t
    out1, act1, e1 = backend.ops.attend_rows(q, kc, ka, vc, va, pos, window, 23456, 40, 1)
    assert np.array_equal(out1, out) and np.array_equal(act1, act) and np.array_equal(e1, act_e)


def test_attend_one_kernel_extremes(backend):
    """Flat scores over 2048 positions with |v| = 127 (every value weight at
    its maximum, the warps' int32 P.V sums at their largest) and queries at
    the int16 bound: still the CPU's bits."""
    T, nh, nkv, D, n = 1, 2, 1, 64, 2048
    pos = np.array([n - 1], np.int32)
    q = np.full((T, nh, D), 2**30, np.int32)
    q[:, 1, ::2] = -2**30
    kc = np.full((n, nkv, D), 127, np.int8)
    kc[:, :, 1::3] = -127
    vc = np.full((n, nkv, D), 127, np.int8)
    vc[:, :, ::3] = -127
    ka = np.full((n, nkv), 1000, np.int32)
    va = np.full((n, nkv), 2**31 - 1, np.int32)
    want = _attend_rows_want(q, kc, ka, vc, va, pos, 0, 23456, 40)
    out, _, _ = backend.ops.attend_rows(q, kc, ka, vc, va, pos, 0, 23456, 40, 3)
    assert np.array_equal(out, want)


@pytest.mark.parametrize("nh,n,launches", [(2, 2048, 1), (2, 2049, 2), (8, 768, 1), (8, 769, 2)])
def test_attend_auto_switches_at_the_bound(backend, nh, n, launches):
    """The launcher's choice for decode rows (path 0): one launch up to
    attn_fused_max_pos positions (2048; 768 for 8 query heads per kv head),
    the two-launch split beyond; the CPU's bits on both sides."""
    q, kc, ka, vc, va, pos = _attend_rows_case(1, n - 1, nh, 1, 32, n + nh)
    want = _attend_rows_want(q, kc, ka, vc, va, pos, 0, 23456, 40)
    n0 = backend.launch_count()
    out, _, _ = backend.ops.attend_rows(q, kc, ka, vc, va, pos, 0, 23456, 40, 0)
    assert backend.launch_count() - n0 == launches
    assert np.array_equal(out, want)


def test_attend_one_kernel_refuses_what_it_cannot_hold(backend):
    q, kc, ka, vc, va, pos = _attend_rows_case(1, 384, 16, 1, 16, 1)  # 385 positions: 16 heads hold 384
    with pytest.raises(ValueError, match="one-kernel"):
        backend.ops.attend_rows(q, kc, ka, vc, va, pos, 0, 23456, 40, 3)
    want = _attend_rows_want(q, kc, ka, vc, va, pos, 0, 23456, 40)
    assert np.array_equal(backend.ops.attend_rows(q, kc, ka, vc, va, pos, 384, 23456, 40, 3)[0],
                          _attend_rows_want(q, kc, ka, vc, va, pos, 384, 23456, 40))  # a window of 384 fits
    assert np.array_equal(backend.ops.attend_rows(q, kc, ka, vc, va, pos, 0, 23456, 40, 0)[0], want)


def _cpu_linear(q, e, w, mant, shift):
    return C.ops.linear(q.astype(np.int16), e.astype(np.int32), w, mant, shift)


@pytest.mark.parametrize("K,N", [(72, 40), (64, 33), (1024, 70), (3072, 9), (4112, 5)])
def test_gemv_prologue(backend, K, N):
    """The decode GEMV whose every block computes its own input in its
    prologue (attn_norm / ffn_norm: RMSNorm + quant16 of the residual rows;
    the down-proj: quant16 of int64 GLU rows) equals the
    separate ops followed by the linear, for 1 and 2 rows, every K split,
    vector and scalar K, zero and extreme rows."""
    rng = np.random.default_rng(K + N)
    w = rng.integers(-127, 128, size=(N, K)).astype(np.int8)
    mant = rng.integers(0, 2**15 + 1, size=N).astype(np.int32)
    shift = rng.integers(-8, 60, size=N).astype(np.int32)
    bias = rng.integers(-2**20, 2**20, size=N).astype(np.int32)
    g = rng.integers(-2**14, 2**14, size=K).astype(np.int16)
    x = rng.integers(-2**31 + 1, 2**31, size=(5, K)).astype(np.int32)
    x[1] = 0
    x[2] = rng.integers(-3, 4, size=K)
    x[3] = rng.integers(-2**12, 2**12, size=K)
    a = rng.integers(-2**62, 2**62, size=(2, K)).astype(np.int64)
    a[1] = rng.integers(-2**20, 2**20, size=K)
    try:
        for wlg in (-1, 0, 1, 2):
            backend.ops.set_gemv_split(wlg)
            for rows in (x[:1], x[:2], x[4:], x[3:1:-1], x[2:4]):
                T = len(rows)
                for eps, frac in ((12345678, 16), (0, 12)):
                    got = backend.ops.gemv_prologue(1, rows, g, eps, frac, None, T, w, mant, shift, bias)
                    q, e = C.ops.quant16(C.ops.rms_norm(rows.astype(np.int64), g, eps, frac))
                    want = np.clip(_cpu_linear(q, e, w, mant, shift) + bias, -(2**31 - 1), 2**31 - 1)
                    assert np.array_equal(got, want), (wlg, T, eps)
            for T in (1, 2):
                got = backend.ops.gemv_prologue(2, None, None, 0, 0, a[:T], T, w, mant, shift)
                q, e = C.ops.quant16(a[:T])
                assert np.array_equal(got, _cpu_linear(q, e, w, mant, shift)), (wlg, T)
    finally:
        backend.ops.set_gemv_split(-1)
    with pytest.raises(ValueError, match="gemv_prologue"):  # 3 rows: no prologue
        backend.ops.gemv_prologue(2, None, None, 0, 0, np.zeros((3, K), np.int64), 3, w, mant, shift)


def test_norm_quant16(backend):
    rng = np.random.default_rng(3)
    for n in (72, 1024, 8192):
        g = rng.integers(2**13, 2**14, size=n).astype(np.int16)
        x = rng.integers(-2**31 + 1, 2**31, size=(6, n)).astype(np.int32)
        x[1] = 0
        x[2] = rng.integers(-3, 4, size=n)
        x[3, :] = 0
        x[3, 5] = -(2**31 - 1)
        x[4] = rng.integers(-2**10, 2**10, size=n)
        for eps in (0, 12345678, 2**62):
            q, e = backend.ops.norm_quant16(x, g, eps)
            wq, we = C.ops.quant16(C.ops.rms_norm(x.astype(np.int64), g, eps, 16))
            assert np.array_equal(q, wq) and np.array_equal(e, we)


def test_swiglu(backend):
    rng = np.random.default_rng(4)
    g = np.concatenate([rng.integers(-2**31 + 1, 2**31, 3000), rng.integers(-2**20, 2**20, 3000),
                        [0, 1, -1, 2**31 - 1, -(2**31 - 1)]]).astype(np.int32)
    u = rng.integers(-2**31 + 1, 2**31, size=g.size).astype(np.int32)
    assert np.array_equal(backend.ops.swiglu(g, u), C.ops.swiglu(g.astype(np.int64), u.astype(np.int64)))


def test_geglu(backend):
    rng = np.random.default_rng(5)
    g = np.concatenate([rng.integers(-2**31 + 1, 2**31, 3000), rng.integers(-2**21, 2**21, 3000),
                        [0, 1, -1, 2**20, -(2**20), 2**20 + 1, 2**31 - 1, -(2**31 - 1)]]).astype(np.int32)
    u = rng.integers(-2**31 + 1, 2**31, size=g.size).astype(np.int32)
    assert np.array_equal(backend.ops.geglu(g, u), C.ops.geglu(g.astype(np.int64), u.astype(np.int64)))


def test_argmax(backend):
    """The device's greedy choice: np.argmax (the largest logit, the lowest id
    among equal ones) for ties, int32 extremes and rows longer than one block
    stride (Qwen3's V = 151936)."""
    rng = np.random.default_rng(8)
    for V in (1, 7, 256, 1000, 20011, 151936):
        rows = [rng.integers(-2**31, 2**31, size=V), rng.integers(-3, 4, size=V), np.full(V, -2**31),
                np.full(V, 2**31 - 1), rng.integers(-2**20, 2**20, size=V)]
        rows[4][[V - 1, V // 3, V // 2]] = 2**20  # a tie of three, the lowest id in the middle of the row
        x = np.array(rows, np.int32)
        assert np.array_equal(backend.ops.argmax(x), np.argmax(x.astype(np.int64), axis=1)), V


def test_emulator_reverse_thread_order():
    """The emulator normally runs a block's threads first to last between
    barriers; last to first finds races the other order hides."""
    mod = _emu_or_skip()
    code = f"""
import importlib.util, sys, numpy as np
sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
from intdet import _core as C
spec = importlib.util.spec_from_file_location("_cuda_emu", {mod.__file__!r})
E = importlib.util.module_from_spec(spec); spec.loader.exec_module(E)
rng = np.random.default_rng(5)
q = rng.integers(-32767, 32768, size=(9, 80)).astype(np.int16); e = rng.integers(0, 9, 9).astype(np.int32)
w = rng.integers(-127, 128, size=(33, 80)).astype(np.int8); m = rng.integers(1, 2**15, 33).astype(np.int32)
s = rng.integers(10, 40, 33).astype(np.int32)
for p in (1, 2): assert np.array_equal(E.ops.linear(q, e, w, m, s, None, p), C.ops.linear(q, e, w, m, s))
from intdet.ref import ops as R
q4 = rng.integers(-32768, 32768, size=(9, 96)).astype(np.int16)
w4 = rng.integers(0, 256, size=(33, 48)).astype(np.uint8); gd = rng.integers(0, 273, size=(33, 3)).astype(np.int16)
gm = rng.integers(-2047, 2048 - 15 * gd.astype(np.int64)).astype(np.int16)
for p in (1, 2): assert np.array_equal(E.ops.linear_w4(q4, e, w4, gd, gm, m, s, None, p),
                                       R.linear(q4, e, R.dequant_int4(w4, gd, gm), m, s))
x = rng.integers(-2**28, 2**28, size=(3, 96)).astype(np.int32); g = rng.integers(2**13, 2**14, 96).astype(np.int16)
qq, ee = E.ops.norm_quant16(x, g, 1000)
wq, we = C.ops.quant16(C.ops.rms_norm(x.astype(np.int64), g, 1000, 16))
assert np.array_equal(qq, wq) and np.array_equal(ee, we)
n, D = 700, 48
kc = rng.integers(-127, 128, size=(n, D)).astype(np.int8); vc = rng.integers(-127, 128, size=(n, D)).astype(np.int8)
ka = rng.integers(0, 2**31 - 1, n).astype(np.int32); va = rng.integers(0, 2**31 - 1, n).astype(np.int32)
qv = rng.integers(-2**30, 2**30, D).astype(np.int32)
q16, e16 = C.ops.quant16(qv.astype(np.int64))
assert np.array_equal(E.ops.attend(qv, kc, ka, vc, va, 23456, 40),
                      C.ops.attend(q16.astype(np.int16), int(e16[0]), kc, ka, vc, va, 23456, 40))
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False,
                       env=dict(os.environ, INTDET_EMU_REVERSE="1"))
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


# ------------------------------------------------------------------ whole models


@pytest.fixture(scope="module")
def converted(tmp_path_factory, tiny_llama_hf, tiny_qwen2_hf, tiny_qwen3_hf, tiny_gemma3_hf):
    """Converted tiny models: llama (untied, K=72 scalar paths), qwen2 (bias,
    tied), qwen3 (q/k norm) and a wider qwen3 whose sizes take the 16-byte
    vector paths (hidden 256, ffn 512, head_dim 64, 2 kv heads, 4 heads)."""
    d = tmp_path_factory.mktemp("cuda_models")
    wide = models.write_hf_model(str(d / "wide_hf"), "qwen3", hidden_size=256, intermediate_size=512,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                 max_position_embeddings=1280)
    out = {}
    for name, src in (("llama", tiny_llama_hf), ("qwen2", tiny_qwen2_hf), ("qwen3", tiny_qwen3_hf), ("wide", wide),
                      ("gemma3", tiny_gemma3_hf)):
        out[name] = load_model(convert(src, str(d / name), progress=False))
    return out


@pytest.fixture(scope="module")
def converted_int4(tmp_path_factory):
    """A tiny qwen3 converted with --weights int4 (linear inputs multiples of 32;
    embedding and lm_head stay int8)."""
    d = tmp_path_factory.mktemp("cuda_int4")
    src = models.write_hf_model(str(d / "hf"), "qwen3", **models.INT4_SHAPE)
    lm = load_model(convert(src, str(d / "m"), progress=False, weights="int4"))
    assert lm.cfg["weight_format"] == "int4" and "blk.0.ffn_down.q4" in lm.tensors
    return lm


def _compare_model(mod, lm, graphs, prompt, steps, batch_co=3, ctx=96):
    cpu = Engine(lm)
    m = mod.Model(lm.cfg, lm.tensors, graphs)
    V = lm.cfg["vocab_size"]
    # prefill with every row's logits, then decode steps
    s = mod.State(m, ctx)
    ref = cpu.new_state(ctx)
    got = mod.forward(m, s, np.array(prompt, np.int32), 0, True)
    assert np.array_equal(got, ref.forward(prompt, all_logits=True)), "prefill"
    rng = np.random.default_rng(len(prompt))
    for i in range(steps):
        tok = int(rng.integers(0, V))
        assert np.array_equal(mod.forward(m, s, np.array([tok], np.int32), s.n_past, False), ref.forward([tok])), i
    # prefill in chunks of 3 matches the whole prefill's last row
    s2 = mod.State(m, ctx)
    for i in range(0, len(prompt), 3):
        last = mod.forward(m, s2, np.array(prompt[i:i + 3], np.int32), s2.n_past, False)
    assert np.array_equal(last, got[-1:])
    # the sequence inside a batch (mixed prefill, then batched decode)
    cos = [list(rng.integers(0, V, size=int(rng.integers(1, 2 * len(prompt))))) for _ in range(batch_co)]
    ss = [mod.State(m, ctx) for _ in range(batch_co + 1)]
    rr = [cpu.new_state(ctx) for _ in range(batch_co + 1)]
    prompts = cos[:1] + [prompt] + cos[1:]
    outs = mod.forward_batch(m, ss, [np.array(p, np.int32) for p in prompts], True)
    want = cpu.forward_batch(rr, prompts, all_logits=True)
    assert all(np.array_equal(a, b) for a, b in zip(outs, want)), "batch prefill"
    assert np.array_equal(outs[1], got)
    for i in range(2):
        nxt = [[int(rng.integers(0, V))] for _ in prompts]
        outs = mod.forward_batch(m, ss, [np.array(t, np.int32) for t in nxt])
        want = cpu.forward_batch(rr, nxt)
        assert all(np.array_equal(a, b) for a, b in zip(outs, want)), f"batch decode {i}"


EMU_CASES = [("llama", False), ("qwen2", True), ("qwen3", False), ("wide", True), ("gemma3", True), ("gemma3", False)]


@pytest.mark.parametrize("name,graphs", EMU_CASES)
def test_model_matches_cpu(backend, converted, name, graphs):
    steps = 3 if is_emu(backend) else 20
    _compare_model(backend, converted[name], graphs, [5, 17, 99, 230, 41, 7, 300, 1, 2], steps)


# Kernel launches per decode token (one row, no graph): the embedding, the
# final norm and the lm_head, plus per layer: q+k+v (one GEMV, attn_norm in
# its prologue), attention (one kernel up to 2048 positions, with q/k norm,
# RoPE and the KV append: RopeFold, and the row's quant16), o-proj (+
# residual), gate+up (ffn_norm in its prologue, SwiGLU in its epilogue),
# down-proj (quant16 of the GLU rows in its prologue, + residual). Before: 16
# per layer (norm, q, k, v, norm_rope x2, kv_append, attention, quant16, o,
# norm, gate, up, swiglu, quant16, down) + 3, so 451 for Qwen3-0.6B's 28
# layers; then 8, 7, then 6 per layer + 4 with the norms and quant16 in
# single-block tails of the GEMVs; then 6 per layer + 3 (171) without tails;
# now 5 per layer + 3 (143) with the attention in one kernel.
def decode_launches(n_layers):
    """Per layer: q+k+v (+ attn_norm), attention (+ rope_append, quant16),
    o-proj, gate+up (+ ffn_norm, GLU), down-proj (+ quant16); then embed,
    out_norm and lm_head."""
    return 5 * n_layers + 3


@pytest.mark.parametrize("name", ["qwen3", "wide", "llama"])
def test_launches_per_decode_token(backend, converted, name, capsys):
    lm = converted[name]
    m = backend.Model(lm.cfg, lm.tensors, False)
    s = backend.State(m, 32)
    backend.forward(m, s, np.array([5, 6, 7], np.int32), 0, False)
    n0 = backend.launch_count()
    backend.forward(m, s, np.array([8], np.int32), 3, False)
    n = backend.launch_count() - n0
    L = lm.cfg["num_layers"]
    with capsys.disabled():
        print(f"\n{name}: {n} kernel launches per decode token ({L} layers; "
              f"Qwen3-0.6B, 28 layers: {decode_launches(28)}, was {28 * 16 + 3})")
    assert n == decode_launches(L)


def test_profile_steps(backend, converted):
    """forward with cudaEvent marks (the device check's per-kernel table): the
    same logits as forward, every step of every layer named in order, and the
    launches of the steps add up to the decode token's launches."""
    lm = converted["qwen3"]
    m = backend.Model(lm.cfg, lm.tensors, False)
    s, s2 = backend.State(m, 32), backend.State(m, 32)
    backend.forward(m, s, np.array([5, 6, 7], np.int32), 0, False)
    backend.forward(m, s2, np.array([5, 6, 7], np.int32), 0, False)
    logits, steps = backend.profile(m, s, np.array([8], np.int32), 3)
    assert np.array_equal(logits, backend.forward(m, s2, np.array([8], np.int32), 3, False))
    layer = ["attn_norm", "qkv", "rope_append", "attention", "o_proj", "ffn_norm", "gate_up_glu", "quant16_ffn",
             "down_proj"]
    assert [p[0] for p in steps] == ["embed"] + layer * lm.cfg["num_layers"] + ["out_norm", "lm_head"]
    assert sum(p[3] for p in steps) == decode_launches(lm.cfg["num_layers"])
    assert all(p[1] >= 0 and p[2] >= 0 for p in steps)
    assert steps[1][2] == 4 * lm.cfg["hidden_size"] and steps[4][2] == 4 * lm.cfg["num_kv_heads"] * (2 * lm.cfg["head_dim"] + 8)


@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_prefill_attention_paths_match_cpu(backend, converted, name):
    """A 45-token prefill (all logits) with the attention forced onto the
    flash-decoding split, onto the tensor cores (16-row tiles), onto the
    one-kernel path and onto the flash tiles (set_attn_path), then a prefill split at 20 and a decode step: the CPU's
    logits on every path (Gemma 3: the sliding window of 5 and two RoPE
    tables)."""
    lm = converted[name]
    rng = np.random.default_rng(45)
    prompt = [int(t) for t in rng.integers(0, lm.cfg["vocab_size"], size=45)]
    cpu = Engine(lm)
    ref = cpu.new_state(64)
    want = ref.forward(prompt, all_logits=True)
    want_next = ref.forward([3])
    m = backend.Model(lm.cfg, lm.tensors, False)
    try:
        for path in (1, 2, 3, 4):
            backend.ops.set_attn_path(path)
            s = backend.State(m, 64)
            assert np.array_equal(backend.forward(m, s, np.array(prompt, np.int32), 0, True), want), path
            assert np.array_equal(backend.forward(m, s, np.array([3], np.int32), 45, False), want_next), path
            s2 = backend.State(m, 64)
            backend.forward(m, s2, np.array(prompt[:20], np.int32), 0, False)
            got = backend.forward(m, s2, np.array(prompt[20:], np.int32), 20, True)
            assert np.array_equal(got, want[20:]), path
    finally:
        backend.ops.set_attn_path(0)


@pytest.mark.parametrize("name", ["wide", "gemma3"])
def test_long_prefill_matches_cpu(backend, converted, name):
    """A long prefill (all logits): 300 tokens of the wide qwen3 (more than
    256 rows: the old auto choice's prefill GEMM), 248 of the tiny Gemma 3
    (its context is 256; hidden 72: element staging, GeGLU, window 5). q+k+v
    and gate+up+GLU run as one skinny GEMM launch each, the attention on the
    flash tiles over several tiles; then a decode step. The CPU's logits,
    bit for bit, and the same with the earlier prefill GEMM and attention
    (set_prefill_gemm(2), set_attn_path(2): the device check's A/B)."""
    lm = converted[name]
    n = min(300, lm.cfg["context_length"] - 8)
    rng = np.random.default_rng(n)
    prompt = [int(t) for t in rng.integers(0, lm.cfg["vocab_size"], size=n)]
    cpu = Engine(lm)
    ref = cpu.new_state(n + 8)
    want = ref.forward(prompt, all_logits=True)
    want_next = ref.forward([5])
    m = backend.Model(lm.cfg, lm.tensors, False)
    try:
        for gemm, attn in ((0, 0), (2, 2)):  # the defaults; the earlier prefill GEMM and attention (A/B timing)
            backend.ops.set_prefill_gemm(gemm)
            backend.ops.set_attn_path(attn)
            s = backend.State(m, n + 8)
            assert np.array_equal(backend.forward(m, s, np.array(prompt, np.int32), 0, True), want), gemm
            assert np.array_equal(backend.forward(m, s, np.array([5], np.int32), n, False), want_next), gemm
    finally:
        backend.ops.set_prefill_gemm(0)
        backend.ops.set_attn_path(0)


LOGITS_SLICE_ROWS = 32  # engine_state.h kLogitsSliceRows


def test_bench_prefill_ab_runs_both_paths(monkeypatch, converted, tmp_path, capsys):
    """scripts/bench_intdet_gpu.py --prefill-ab (the device check's A/B of
    the prefill paths) on the emulator: the prefill timed on the default
    paths and on the earlier ones, the ratio printed, and the overrides put
    back (the model's next prefill is the CPU's)."""
    mod = _emu_or_skip()
    monkeypatch.setattr("intdet.backends.cuda.cuda_module", lambda: mod)
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import bench_intdet_gpu

    lm = converted["wide"]
    calls = []
    for name in ("set_prefill_gemm", "set_attn_path"):
        real = getattr(mod.ops, name)
        monkeypatch.setattr(mod.ops, name, lambda p, real=real, name=name: calls.append((name, p)) or real(p))
    rc = bench_intdet_gpu.main([lm.path, str(tmp_path / "rows.jsonl"), "--model", "qwen3-0.6b", "--device", "cuda",
                                "--batches", "1", "--prompt", "4", "--steps", "1", "--prefill", "40", "--prefill-ab"])
    out = capsys.readouterr().out
    assert rc == 0 and "on the earlier paths" in out and "now / earlier = " in out, out
    assert calls == [("set_prefill_gemm", 2), ("set_attn_path", 2), ("set_prefill_gemm", 0), ("set_attn_path", 0)]


def decode_batch_launches(n_layers, rows):
    """Launches of a decode step of 9..256 rows (no graph): per layer
    attn_norm, q+k+v (one skinny GEMM, three segments), attention (one
    kernel, RopeFold), o-proj (+ residual), ffn_norm, gate+up (one skinny
    GEMM, SwiGLU in its epilogue), quant16, down-proj (+ residual); then
    embed, and out_norm and lm_head for each slice of up to 32 rows (each
    slice's logits copied while the next computes)."""
    return 8 * n_layers + 1 + 2 * -(-rows // LOGITS_SLICE_ROWS)


@pytest.mark.parametrize("batch", [64, 130])
def test_decode_batch_skinny_graphs(backend, converted, batch):
    """A decode batch of 64 and of 130 sequences (the skinny IMMA GEMM; 130:
    three 64-row tiles) after a mixed batch prefill: every sequence gets the
    CPU's logits, without graphs (q+k+v and gate+up + SwiGLU in one launch
    each, the decode attention with the rope_append folded in: 8 launches
    per layer) and with them (the second step of the same shape replays the
    captured graph: no launch enqueued)."""
    lm = converted["wide"]
    cpu = Engine(lm)
    V = lm.cfg["vocab_size"]
    L = lm.cfg["num_layers"]
    rng = np.random.default_rng(batch)
    prompts = [[int(t) for t in rng.integers(0, V, size=int(rng.integers(1, 4)))] for _ in range(batch)]
    for graphs in (False, True):
        m = backend.Model(lm.cfg, lm.tensors, graphs)
        ss = [backend.State(m, 24) for _ in prompts]
        rr = [cpu.new_state(24) for _ in prompts]
        outs = backend.forward_batch(m, ss, [np.array(p, np.int32) for p in prompts], True)
        want = cpu.forward_batch(rr, prompts, all_logits=True)
        assert all(np.array_equal(a, b) for a, b in zip(outs, want)), "batch prefill"
        for i in range(3):
            nxt = [[int(rng.integers(0, V))] for _ in prompts]
            n0 = backend.launch_count()
            outs = backend.forward_batch(m, ss, [np.array(t, np.int32) for t in nxt])
            n = backend.launch_count() - n0
            want = cpu.forward_batch(rr, nxt)
            assert all(np.array_equal(a, b) for a, b in zip(outs, want)), (graphs, i)
            if not graphs:
                assert n == decode_batch_launches(L, batch), n
            elif i > 0:
                assert n == 0, n  # replayed


@pytest.fixture
def logits_rows(backend):
    """set_logits_rows(slice, group) for one test, and the emulator's stream
    order; both back to the defaults afterwards."""
    yield backend.ops.set_logits_rows
    backend.ops.set_logits_rows(0, 0)
    if is_emu(backend):
        backend.ops.set_emu_stream_order(False)


def _stream_orders(backend):
    # the emulator runs queued work at each synchronization point with the
    # model's stream first, then with the copy stream first: a missing wait
    # between them shows as wrong logits in one of the two
    return (False, True) if is_emu(backend) else (None,)


@pytest.mark.parametrize("graphs", [False, True])
def test_logits_slices_match_cpu(backend, converted, logits_rows, graphs):
    """The lm_head in slices of 2 rows, each slice's logits copied on the copy
    stream (engine_forward.cpp copy_slices): a batch prefill with every
    row's logits, in groups of 5 rows too (the non-graph loop: group after
    group through one logits buffer), then batched decode steps of 5
    sequences (3 slices; graphs: captured with external event records and
    replayed) give the CPU's logits bit for bit, in either stream order of
    the emulator."""
    lm = converted["qwen2"]
    cpu = Engine(lm)
    V = lm.cfg["vocab_size"]
    rng = np.random.default_rng(5)
    for order in _stream_orders(backend):
        if order is not None:
            backend.ops.set_emu_stream_order(order)
        for group in (0, 5):
            logits_rows(2, group)
            m = backend.Model(lm.cfg, lm.tensors, graphs)
            prompts = [[int(t) for t in rng.integers(0, V, size=int(rng.integers(1, 6)))] for _ in range(5)]
            ss = [backend.State(m, 24) for _ in prompts]
            rr = [cpu.new_state(24) for _ in prompts]
            outs = backend.forward_batch(m, ss, [np.array(p, np.int32) for p in prompts], True)
            want = cpu.forward_batch(rr, prompts, all_logits=True)
            assert all(np.array_equal(a, b) for a, b in zip(outs, want)), (order, group, "prefill")
            for i in range(3):  # graphs: captured, then replayed
                nxt = [[int(rng.integers(0, V))] for _ in prompts]
                outs = backend.forward_batch(m, ss, [np.array(t, np.int32) for t in nxt])
                want = cpu.forward_batch(rr, nxt)
                assert all(np.array_equal(a, b) for a, b in zip(outs, want)), (order, group, i)
            s1, r1 = backend.State(m, 24), cpu.new_state(24)  # one sequence, every row: 4 slices of a prefill
            got = backend.forward(m, s1, np.array(prompts[0] + [3, 4, 5, 6, 7, 8], np.int32), 0, True)
            assert np.array_equal(got, r1.forward(prompts[0] + [3, 4, 5, 6, 7, 8], all_logits=True)), (order, group)


def test_logits_arrays_pinned_and_kept(backend, converted, logits_rows):
    """forward's logits arrays come from the pinned pool (a block per array,
    given back when the array dies and handed out again), are ordinary
    writable arrays, and keep their values across later forwards (which
    reuse the device's logits buffer and the pool's other blocks)."""
    lm = converted["qwen3"]
    cpu = Engine(lm)
    V = lm.cfg["vocab_size"]
    logits_rows(2, 0)
    m = backend.Model(lm.cfg, lm.tensors, False)
    ss = [backend.State(m, 32) for _ in range(3)]
    rr = [cpu.new_state(32) for _ in range(3)]
    kept, want = [], []
    for i in range(4):
        toks = [[5 + i + k] for k in range(3)]
        outs = backend.forward_batch(m, ss, [np.array(t, np.int32) for t in toks])
        ref = cpu.forward_batch(rr, toks)
        assert all(np.array_equal(a, b) for a, b in zip(outs, ref)), i
        assert outs[0].flags.writeable and outs[0].dtype == np.int32 and outs[0].shape == (1, V)
        kept.append(outs)
        want.append([r.copy() for r in ref])
    assert all(np.array_equal(a, b) for got, ref in zip(kept, want) for a, b in zip(got, ref)), "kept arrays changed"
    kept[0][1][0, :3] = [1, 2, 3]  # writable: the caller's to change
    assert list(kept[0][1][0, :3]) == [1, 2, 3]
    before = backend.ops.pinned_stats()
    del kept, outs
    after = backend.ops.pinned_stats()
    assert after["live_blocks"] == before["live_blocks"] - 4 and after["kept_blocks"] >= 1
    for i in range(5):  # same-sized outputs: served from the kept blocks, none pinned afresh
        toks = [[9 + i + k] for k in range(3)]
        outs = backend.forward_batch(m, ss, [np.array(t, np.int32) for t in toks])
        assert all(np.array_equal(a, b) for a, b in zip(outs, cpu.forward_batch(rr, toks))), i
        del outs
    end = backend.ops.pinned_stats()
    assert end["reuses"] == after["reuses"] + 5 and end["allocs"] == after["allocs"]
    # a caller's own out array (pageable memory) still gets every slice
    s4, r4 = backend.State(m, 32), cpu.new_state(32)
    out = np.full((6, V), -1, np.int32)
    got = backend.forward(m, s4, np.arange(3, 9, dtype=np.int32), 0, True, out)
    assert got is out or np.shares_memory(got, out)
    assert np.array_equal(out, r4.forward(list(range(3, 9)), all_logits=True))


def test_logits_slices_chain_hash(monkeypatch, converted, logits_rows):
    """The product's loop with slices of 1 row and groups of 2 (every batched
    step runs several slices and groups): three requests decoded together
    through the scheduler, and one alone on the device lane (submit_pick /
    wait_pick), give the CPU reference loop's tokens and chain hashes."""
    from intdet.scheduler import Request, Scheduler
    from oracle import generate

    mod = _emu_or_skip()
    monkeypatch.setattr("intdet.backends.cuda.cuda_module", lambda: mod)
    lm = converted["wide"]
    cpu = Engine(lm, "cpu")
    prompts = [[1, 40, 41, 42], [7, 8], [300, 5, 6, 9, 11]]
    want = [generate(cpu, p, 5) for p in prompts]
    logits_rows(1, 2)
    for graphs in (False, True):
        eng = Engine(lm, "cuda")
        eng.cuda_graphs = graphs
        sch = Scheduler(eng, max_batch=4, step_tokens=4, kv_bytes=1 << 40)
        reqs = [sch.submit(Request(p, 5)) for p in prompts]
        sch.run_until_idle()
        for r, w in zip(reqs, want):
            assert r.tokens == w.tokens and r.hash == w.hash, graphs
        r, _ = _lane_run(lm, "cuda", prompts[0], 5, graphs=graphs)
        assert r.tokens == want[0].tokens and r.hash == want[0].hash, graphs


@pytest.fixture(scope="module")
def converted_grp16(tmp_path_factory):
    """A one-layer qwen3 with 16 query heads on one kv head (D = 16): the
    one-kernel attention holds 384 positions (attn_fused_max_pos(16))."""
    d = tmp_path_factory.mktemp("cuda_grp16")
    src = models.write_hf_model(str(d / "hf"), "qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                num_attention_heads=16, num_key_value_heads=1, head_dim=16,
                                max_position_embeddings=512)
    return load_model(convert(src, str(d / "m"), progress=False))


@pytest.mark.parametrize("graphs", [False, True])
def test_decode_across_the_one_kernel_bound(backend, converted_grp16, graphs):
    """Decode steps from 380 to 388 positions: one attention launch per layer
    up to 384 positions, the split's two beyond (graphs: one graph per
    length bucket); the CPU's logits at every step."""
    lm = converted_grp16
    cpu = Engine(lm)
    m = backend.Model(lm.cfg, lm.tensors, graphs)
    s, ref = backend.State(m, 400), cpu.new_state(400)
    rng = np.random.default_rng(380)
    V = lm.cfg["vocab_size"]
    prompt = [int(t) for t in rng.integers(0, V, size=380)]
    assert np.array_equal(backend.forward(m, s, np.array(prompt, np.int32), 0, False), ref.forward(prompt))
    L = lm.cfg["num_layers"]
    for pos in range(380, 388):
        tok = int(rng.integers(0, V))
        n0 = backend.launch_count()
        got = backend.forward(m, s, np.array([tok], np.int32), pos, False)
        if not graphs:  # positions 0..pos: pos + 1 of them
            assert backend.launch_count() - n0 == decode_launches(L) + (L if pos + 1 > 384 else 0), pos
        assert np.array_equal(got, ref.forward([tok])), pos


@pytest.mark.parametrize("graphs", [False, True])
def test_int4_model_matches_cpu(backend, converted_int4, graphs):
    """Int4 weights: prefill (GEMM for > 32 rows), decode, chunks and batches
    give the CPU core's logits bit for bit."""
    steps = 3 if is_emu(backend) else 20
    rng = np.random.default_rng(21)
    prompt = [int(t) for t in rng.integers(0, converted_int4.cfg["vocab_size"], size=40)]
    _compare_model(backend, converted_int4, graphs, prompt, steps, batch_co=2)


def _lane_run(lm, device, prompt, n, sampler=None, eos_ids=(), stop=(), tokenizer=None, max_batch=1, extra=None,
              graphs=None):
    """The product's loop (the scheduler) on ``device``: (request, extra request or None)."""
    from intdet.scheduler import Request, Scheduler

    eng = Engine(lm, device)
    if graphs is not None:
        eng.cuda_graphs = graphs
    sch = Scheduler(eng, max_batch=max_batch, step_tokens=4, kv_bytes=1 << 40)
    req = sch.submit(Request(prompt, n, sampler, eos_ids=eos_ids, stop=stop, tokenizer=tokenizer))
    other = None
    if extra is not None:  # a second request joining after `extra` steps
        for _ in range(extra):
            sch.step()
        other = sch.submit(Request([5, 6, 7], 4))
    sch.run_until_idle()
    return req, other


def test_engine_generate_hash_equal(monkeypatch, converted):
    """Engine(device='cuda') end to end through the scheduler (emulator here,
    the GPU below): the chain hash of a greedy generation equals the CPU
    reference loop's."""
    from oracle import generate

    mod = _emu_or_skip()
    monkeypatch.setattr("intdet.backends.cuda.cuda_module", lambda: mod)
    lm = converted["qwen3"]
    g_cpu = generate(Engine(lm, "cpu"), [1, 40, 41, 42, 43], 6)
    for graphs in (False, True):
        r, _ = _lane_run(lm, "cuda", [1, 40, 41, 42, 43], 6, graphs=graphs)
        assert r.hash == g_cpu.hash and r.tokens == g_cpu.tokens
    gpu = Engine(lm, "cuda", cuda_graphs=False)  # the backend's controls on cuda
    assert (gpu.isa, gpu.available_isas(), gpu.threads, gpu.cuda_graphs) == ("cuda", ["cuda"], 1, False)
    gpu.cuda_graphs = True
    assert gpu.cuda_graphs and gpu.device_name == mod.device_name()
    from intdet.trace import first_divergence, trace_names

    ids = [1, 40, 41, 42, 43]
    assert first_divergence(gpu.trace(ids), Engine(lm, "cpu").trace(ids), trace_names(lm.cfg)) is None


def test_scheduler_device_lane(monkeypatch, converted):
    """The scheduler's device lane (one request alone on the CUDA engine):
    each token after the first is chosen on the device and the next step is
    enqueued before the host hashes (submit_pick / wait_pick): the same
    tokens and chain hashes as the CPU reference loop for prefill splits,
    graphs, an eos stop, a stop string (the step enqueued ahead is dropped),
    the end of the context, temperature sampling with top-k/top-p/min-p, a
    repetition penalty (host picks), and a second request joining midway
    (the lane ends; both equal their runs alone)."""
    import intdet.model as M
    from intdet.sampling import Sampler
    from oracle import generate

    mod = _emu_or_skip()
    monkeypatch.setattr("intdet.backends.cuda.cuda_module", lambda: mod)
    calls = []
    real = M.State.submit_pick
    monkeypatch.setattr(M.State, "submit_pick", lambda self, t=None, s=None: calls.append(t) or real(self, t, s))
    lm = converted["wide"]
    prompt = [1, 40, 41, 42, 43, 44, 45]
    cpu = Engine(lm, "cpu")
    want = generate(cpu, prompt, 6)
    for graphs in (False, True):
        calls.clear()
        r, _ = _lane_run(lm, "cuda", prompt, 6, graphs=graphs)
        assert r.tokens == want.tokens and r.hash == want.hash and r.hashes == want.hashes
        # the first token picked on the host from the prefill's logits and fed by the first submit, 5 on the device
        assert len(calls) == 5 and list(calls[0]) == want.tokens[:1] and calls[1:] == [None] * 4
    for eos in dict.fromkeys(want.tokens):  # each id as the eos, ending at its first occurrence
        calls.clear()
        r, _ = _lane_run(lm, "cuda", prompt, 6, eos_ids=[eos])
        w = generate(cpu, prompt, 6, eos_ids=[eos])
        assert r.finish_reason == w.stop == "eos" and r.tokens == w.tokens and r.hash == w.hash
        assert len(calls) == want.tokens.index(eos)  # no step enqueued after the eos

    class Tok:  # each id is one character: a stop string at the second token
        def id_to_token(self, i):
            return str(i)

        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(65 + i % 26) for i in ids)

    stop = "".join(chr(65 + t % 26) for t in want.tokens[1:2])
    calls.clear()
    r, _ = _lane_run(lm, "cuda", prompt, 6, stop=[stop], tokenizer=Tok())
    k = next(i for i, t in enumerate(want.tokens) if chr(65 + t % 26) == stop)
    assert r.finish_reason == "stop" and r.tokens == want.tokens[:k + 1] and len(calls) == k + 1
    assert r.hash == generate(cpu, prompt, 6, on_token=lambda t, n=[0]: (n.__setitem__(0, n[0] + 1) or n[0]) > k).hash
    small = converted["qwen3"]
    ctx = small.cfg["context_length"]
    long_prompt = [int(t) for t in np.random.default_rng(3).integers(0, small.cfg["vocab_size"], size=ctx - 3)]
    r, _ = _lane_run(small, "cuda", long_prompt, 10)
    w = generate(Engine(small, "cpu"), long_prompt, 10)
    assert r.finish_reason == w.stop == "context" and r.tokens == w.tokens and r.hash == w.hash
    for samp, on_device in ((dict(temperature="0.8", seed=5), True), (dict(temperature="3", seed=2**64 - 1), True),
                            (dict(temperature="0.8", top_k=3), True), (dict(temperature="1", min_p="0.1"), True),
                            (dict(temperature="2", top_p="0.5", top_k=40, min_p="0.01"), True),
                            (dict(temperature="0.8", repeat_penalty="1.3"), False)):
        calls.clear()
        r, _ = _lane_run(lm, "cuda", prompt, 5, Sampler(**samp))
        w = generate(cpu, prompt, 5, Sampler(**samp))
        assert r.tokens == w.tokens and r.hash == w.hash and bool(calls) == on_device, samp
    calls.clear()
    r, o = _lane_run(lm, "cuda", prompt, 8, max_batch=2, extra=4)
    assert r.tokens == generate(cpu, prompt, 8).tokens and r.hash == generate(cpu, prompt, 8).hash
    assert o.hash == generate(cpu, [5, 6, 7], 4).hash
    assert 0 < len(calls) < 7  # the lane ran, then stopped when the second request came


@given(V=st.integers(1, 700), spread=st.sampled_from([0, 3, 2**16, 2**22, 2**31]), temp=st.sampled_from(
    ["0.8", "1", "0.05", "3.7", "100", "0.000001"]), seed=st.integers(0, 2**64 - 1), pos=st.integers(0, 2**20),
    top_k=st.sampled_from([0, 0, 1, 2, 5, 64, 10**6]), top_p=st.sampled_from(["1", "1", "0.9", "0.5", "0.000001",
    "0.999999"]), min_p=st.sampled_from(["0", "0", "0.05", "0.5", "1", "0.000001"]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_sample_is_the_host_sampler(backend, V, spread, temp, seed, pos, top_k, top_p, min_p):
    """The device sampler (no sort: binary searches over logit values for the
    cuts and the pick, then over ids of the chosen value) picks Sampler.pick's
    token: ties, logits spread from all-equal to the whole int32 range, tiny
    and huge temperatures, top-k (1 to more than the vocabulary), top-p and
    min-p (a millionth to 1) alone and together."""
    from intdet.sampling import Sampler, draw_u64

    rng = np.random.default_rng(seed % 2**32)
    lo, hi = max(-2**31, -spread), min(2**31, spread + 1)
    logits = rng.integers(lo, hi, size=V).astype(np.int32)
    if V > 3:
        logits[rng.integers(0, V, size=3)] = logits.max()  # ties at the top
    if V > 8:
        logits[rng.integers(0, V, size=5)] = logits[rng.integers(0, V)]  # ties inside the order (cut points)
    samp = Sampler(temperature=temp, seed=seed, top_k=top_k, top_p=top_p, min_p=min_p)
    want = samp.pick(logits, pos)
    assert backend.ops.sample(logits, samp.t_num, samp.t_den, draw_u64(seed, pos), samp.top_k, samp.p_num,
                              samp.p_den, samp.m_num, samp.m_den) == want


@pytest.mark.parametrize("k,p,m", [(3, "1", "0"), (0, "0.6", "0"), (0, "1", "0.2"), (4, "0.7", "0.1")])
def test_sample_cuts_inside_ties(backend, k, p, m):
    """Cuts that fall inside a run of equal logits (top-k in the middle of
    ties, top-p and min-p at a tie group): every seed picks the host's token."""
    from intdet.sampling import Sampler, draw_u64

    logits = np.array([5 << 16, 5 << 16, 4 << 16, 4 << 16, 4 << 16, 4 << 16, 3 << 16, 0, -(40 << 16)], np.int32)
    for seed in range(30):
        samp = Sampler(temperature="1.5", seed=seed, top_k=k, top_p=p, min_p=m)
        got = backend.ops.sample(logits, samp.t_num, samp.t_den, draw_u64(seed, 7), samp.top_k, samp.p_num,
                                 samp.p_den, samp.m_num, samp.m_den)
        assert got == samp.pick(logits, 7), seed


# ------------------------------------------------------------------ GPU only


@needs_gpu
@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "wide", "gemma3"])
def test_gpu_generate_hash_equal(converted, name):
    from oracle import generate

    lm = converted[name]
    want = generate(Engine(lm, "cpu"), [1, 40, 41, 42, 43, 44, 45], 40)
    for graphs in (False, True):
        g = generate(Engine(lm, "cuda", cuda_graphs=graphs), [1, 40, 41, 42, 43, 44, 45], 40, prefill_chunk=3)
        assert g.hash == want.hash and g.tokens == want.tokens
        r, _ = _lane_run(lm, "cuda", [1, 40, 41, 42, 43, 44, 45], 40, graphs=graphs)  # the device lane
        assert r.hash == want.hash and r.tokens == want.tokens


@needs_gpu
def test_gpu_int4_generate_hash_equal(converted_int4):
    """Int4 weights on the GPU: a 200-token prefill (GEMM) then greedy decode
    (GEMV), with and without graphs: the CPU's chain hash."""
    from oracle import generate

    lm = converted_int4
    prompt = [int(t) for t in np.random.default_rng(12).integers(0, lm.cfg["vocab_size"], size=200)]
    want = generate(Engine(lm, "cpu"), prompt, 40)
    for graphs in (False, True):
        g = generate(Engine(lm, "cuda", cuda_graphs=graphs), prompt, 40)
        assert g.hash == want.hash and g.tokens == want.tokens


@needs_gpu
@pytest.mark.parametrize("batch", [1, 2, 8, 32, 64, 256])  # 64, 256: the skinny GEMM, graphs
def test_gpu_batch_invariance(converted, batch):
    lm = converted["wide"]
    cpu, gpu = Engine(lm, "cpu"), Engine(lm, "cuda")
    rng = np.random.default_rng(batch)
    prompts = [list(rng.integers(0, 320, size=int(rng.integers(1, 40)))) for _ in range(batch)]
    cs, gs = [cpu.new_state(128) for _ in prompts], [gpu.new_state(128) for _ in prompts]
    assert all(np.array_equal(a, b) for a, b in zip(gpu.forward_batch(gs, prompts, True), cpu.forward_batch(cs, prompts, True)))
    for graphs in (False, True, True):
        gpu.cuda_graphs = graphs
        nxt = [[int(rng.integers(0, 320))] for _ in prompts]
        assert all(np.array_equal(a, b) for a, b in zip(gpu.forward_batch(gs, nxt), cpu.forward_batch(cs, nxt)))


@needs_gpu
def test_gpu_long_context(converted):
    """Over 1024 cached positions: P.V runs in several int32 blocks; the
    prefill takes the tiled GEMM, decode the GEMV."""
    lm = converted["wide"]
    rng = np.random.default_rng(11)
    prompt = list(rng.integers(0, 320, size=1100))
    cpu, gpu = Engine(lm, "cpu").new_state(1200), Engine(lm, "cuda").new_state(1200)
    assert np.array_equal(gpu.forward(prompt, all_logits=True), cpu.forward(prompt, all_logits=True))
    for t in rng.integers(0, 320, size=10):
        assert np.array_equal(gpu.forward([int(t)]), cpu.forward([int(t)]))


def test_random_model_cli_matches_generator(tmp_path):
    """`intdet random-model` (the device check's model source) writes the
    same bytes as tests/models.py."""
    from click.testing import CliRunner

    from intdet.cli import main

    r = CliRunner().invoke(main, ["random-model", str(tmp_path / "cli"), "--shape", "tiny-qwen3", "--seed", "3"])
    assert r.exit_code == 0, r.output
    ref = models.write_hf_model(str(tmp_path / "ref"), "qwen3", seed=3)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        with open(tmp_path / "cli" / name, "rb") as a, open(os.path.join(ref, name), "rb") as b:
            assert a.read() == b.read(), name


# ------------------------------------------------------------------ named intermediates (python/intdet/trace.py)

TRACE_IDS = [5, 17, 99, 230, 41, 7, 300, 12]


def _traced_models(converted, converted_int4):
    return {"qwen3": converted["qwen3"], "qwen2": converted["qwen2"], "int4": converted_int4,
            "gemma3": converted["gemma3"]}


@pytest.mark.parametrize("name,graphs", [("qwen3", False), ("qwen2", True), ("int4", False), ("gemma3", False)])
def test_trace_is_the_cpu_trace(monkeypatch, backend, converted, converted_int4, name, graphs):
    """_cuda.forward_trace has the C++ core's names, order, shapes and every
    bit (graphs on: a traced call bypasses them); its logits are forward's."""
    from intdet.trace import first_divergence, trace_cpu, trace_cuda, trace_names

    monkeypatch.setattr("intdet.backends.cuda.cuda_module", lambda: backend)
    lm = _traced_models(converted, converted_int4)[name]
    cpu = trace_cpu(Engine(lm, "cpu"), TRACE_IDS)
    gpu_engine = Engine(lm, "cuda", cuda_graphs=graphs)
    gpu = trace_cuda(gpu_engine, TRACE_IDS)
    names = trace_names(lm.cfg)
    assert list(cpu) == names and list(gpu) == names
    for n in names:
        assert gpu[n].dtype == np.int64 and gpu[n].shape == cpu[n].shape, n
        assert np.array_equal(gpu[n], cpu[n]), n
    assert first_divergence(cpu, gpu, names) is None
    mod, m = gpu_engine.backend, gpu_engine._model
    s = mod.State(m, len(TRACE_IDS) + 2)
    logits, named, used = mod.forward_trace(m, s, np.asarray(TRACE_IDS, np.int32), 0)
    assert used == "cuda" and s.n_past == len(TRACE_IDS)
    s2 = mod.State(m, len(TRACE_IDS) + 2)
    assert np.array_equal(logits, mod.forward(m, s2, np.asarray(TRACE_IDS, np.int32), 0, True))
    assert np.array_equal(named["output"], logits)
    # the traced call filled the cache like forward: the next (graph) step agrees
    step = np.asarray([3], np.int32)
    assert np.array_equal(mod.forward(m, s, step, s.n_past), mod.forward(m, s2, step, s2.n_past))
    # a traced call after cached positions (a decode step) also matches the CPU's
    cpu_engine = Engine(lm, "cpu")
    st_cpu = C.State(cpu_engine._model, 4)
    st_gpu = mod.State(m, 4)
    C.forward(cpu_engine._model, st_cpu, np.asarray(TRACE_IDS[:3], np.int32), 0, False)
    mod.forward(m, st_gpu, np.asarray(TRACE_IDS[:3], np.int32), 0, False)
    _, want, _ = C.forward_trace(cpu_engine._model, st_cpu, np.asarray([9], np.int32), 3)
    _, got, _ = mod.forward_trace(m, st_gpu, np.asarray([9], np.int32), 3)
    assert first_divergence(dict(want), dict(got), names) is None


def test_trace_checks_its_arguments(backend, converted):
    lm = converted["qwen3"]
    m = backend.Model(lm.cfg, lm.tensors)
    s = backend.State(m, 4)
    with pytest.raises(ValueError, match="KV cache"):
        backend.forward_trace(m, s, np.asarray(TRACE_IDS, np.int32), 0)
    with pytest.raises(ValueError, match="cached positions"):
        backend.forward_trace(m, s, np.asarray(TRACE_IDS[:2], np.int32), 1)
    with pytest.raises(ValueError, match="at least one token"):
        backend.forward_trace(m, s, np.asarray([], np.int32), 0)
    assert s.n_past == 0


def _spoiled(fn, call, where):
    """fn whose result of call number `call` is off by one at `where`."""
    n = [0]

    def broken(*a, **k):
        out = fn(*a, **k)
        if n[0] == call:
            out = np.array(out, copy=True)
            out[where] += 1
        n[0] += 1
        return out

    return broken


@pytest.mark.parametrize("op,call,first", [
    ("swiglu", 1, "blk.1.ffn_swiglu"),  # layer 0 still agrees: the first difference is named
    ("shift_round_sat32", 0, "tok_embd"),
])
def test_first_divergence_names_the_cuda_difference(monkeypatch, converted, op, call, first):
    """compare_backends with cuda on one side: a deliberately broken ref op
    (so ref vs cuda differ) is named; cuda vs the CPU still agree."""
    from intdet.ref import ops as ref_ops
    from intdet.trace import compare_backends

    mod = _emu_or_skip()
    calls = []

    class Counted:  # the module, counting its traced calls: "cuda" must be the CUDA engine's trace
        def __getattr__(self, name):
            if name == "forward_trace":
                calls.append(name)
            return getattr(mod, name)

    monkeypatch.setattr("intdet.backends.cuda.cuda_module", lambda: Counted())
    engine = Engine(converted["qwen3"], "cuda")
    res = compare_backends(engine, TRACE_IDS, ["cuda", "scalar", C.available_isas()[-1]])
    assert [d for _, d in res] == [None, None] and len(calls) == 1
    monkeypatch.setattr(ref_ops, op, _spoiled(getattr(ref_ops, op), call, 0))
    (backend, div), = compare_backends(engine, TRACE_IDS, ["ref", "cuda"])
    assert backend == "cuda" and div is not None and div[0] == first, div
    assert "values differ" in div[1]


def test_first_divergence_names_a_perturbed_cuda_tensor(monkeypatch, converted):
    """One value of one CUDA traced tensor changed: that tensor is named, even
    when later ones (here every one) agree."""
    from intdet.trace import first_divergence, trace_cuda, trace_names

    mod = _emu_or_skip()
    monkeypatch.setattr("intdet.backends.cuda.cuda_module", lambda: mod)
    lm = converted["qwen2"]
    names = trace_names(lm.cfg)
    gpu = trace_cuda(Engine(lm, "cuda"), TRACE_IDS)
    for name in ("blk.0.attn_v", "blk.1.ffn_norm", "output"):
        bad = dict(gpu)
        bad[name] = gpu[name].copy()
        bad[name][-1, ...].flat[-1] += 1
        div = first_divergence(gpu, bad, names)
        assert div is not None and div[0] == name and div[1].startswith("1 of "), div


def test_first_divergence_script_cuda_backend(monkeypatch, capsys, converted):
    """scripts/first_divergence.py --backends cuda,...: agrees, then names the
    tensor a broken ref op changes; without a GPU module it says why (exit 2)."""
    import importlib.util

    from intdet.ref import ops as ref_ops

    mod = _emu_or_skip()
    spec = importlib.util.spec_from_file_location("first_divergence", os.path.join(ROOT, "scripts",
                                                                                   "first_divergence.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    path = os.path.dirname(converted["qwen3"].cfg_path)
    ids = ",".join(map(str, TRACE_IDS))
    if not HAVE_GPU:
        assert script.main(["-m", path, "--ids", ids, "--backends", "scalar,cuda"]) == 2
        assert "first_divergence: error: device cuda:" in capsys.readouterr().err
    monkeypatch.setattr("intdet.backends.cuda.cuda_module", lambda: mod)
    assert script.main(["-m", path, "--ids", ids, "--backends", "cuda,ref,scalar"]) == 0
    out = capsys.readouterr().out
    assert "ref vs cuda: all " in out and "scalar vs cuda: all " in out
    monkeypatch.setattr(ref_ops, "swiglu", _spoiled(ref_ops.swiglu, 0, 0))
    assert script.main(["-m", path, "--ids", ids, "--backends", "cuda,ref"]) == 1
    assert "ref vs cuda: first divergence at blk.0.ffn_swiglu" in capsys.readouterr().out


def test_hash_check_device_cuda_on_the_emulator(monkeypatch, converted, tmp_path):
    """`intdet hash-check --device cuda` (the verb, in process, on the host
    emulator): every GPU configuration (prefill splits, batches, graphs,
    sampled) equal to the CPU run, through the scheduler's loop."""
    from click.testing import CliRunner

    from intdet.cli import main

    mod = _emu_or_skip()
    monkeypatch.setattr("intdet.backends.cuda.cuda_module", lambda: mod)
    lm = converted["qwen3"]
    r = CliRunner().invoke(main, ["hash-check", "-m", os.path.dirname(lm.st_path), "--device", "cuda", "--steps", "3",
                                  "--prompt", "hello", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    assert out["all_equal"] and len(out["runs"]) == 10
    assert any(x["config"].startswith(f"cuda ({mod.device_name()})") for x in out["runs"])


@needs_gpu
def test_gpu_copy_prefix(converted):
    """State.copy_prefix on the GPU: the copied KV continues exactly as a
    cold prefill does (every logit's bits), for a dense and a windowed model."""
    for name in ("wide", "gemma3"):
        lm = converted[name]
        gpu, cpu = Engine(lm, "cuda"), Engine(lm, "cpu")
        ids = [int(t) for t in np.random.default_rng(4).integers(0, lm.cfg["vocab_size"], 60)]
        a = gpu.new_state(64)
        a.forward(ids[:50])
        b = gpu.new_state(64)
        b.copy_prefix(a, 40)
        want = cpu.new_state(64).forward(ids, all_logits=True)[40:]
        assert np.array_equal(b.forward(ids[40:], all_logits=True), want), name


def test_update_weights_on_cuda_equals_cpu(monkeypatch, tmp_path):
    """LLM.update_weights on the CUDA backend (a new device model built
    before the swap) gives the CPU's bits after the update (emulator here)."""
    import models
    import numpy as np
    from safetensors.numpy import load_file

    import intdet
    from intdet.convert import convert

    mod = _emu_or_skip()
    monkeypatch.setattr("intdet.backends.cuda.cuda_module", lambda: mod)
    hf = models.write_hf_model(str(tmp_path / "hf"), "qwen3")
    m = convert(hf, str(tmp_path / "m"), progress=False)
    rng = np.random.default_rng(2)
    new = {k: v + rng.normal(0, 0.02, v.shape).astype(np.float32) for k, v in load_file(f"{hf}/model.safetensors").items()}
    sp = intdet.SamplingParams(max_tokens=6, temperature=0, seed=0)
    cpu, gpu = intdet.LLM(m, threads=1), intdet.LLM(m, device="cuda")
    before = gpu.generate("hello world", sp).hash
    assert cpu.update_weights(new) == gpu.update_weights(new)
    after = gpu.generate("hello world", sp)
    assert after.hash == cpu.generate("hello world", sp).hash != before
    assert after.model_version == cpu.model_version
