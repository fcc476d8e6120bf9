"""The chain hash on other CPU architectures and byte orders.

csrc/tools/intdet_run is a standalone C++ greedy generator (no Python) that
reads a converted model directory itself and prints the chain hash of
docs/chain-hash.md. These tests build it with CMake (INTDET_TOOLS=ON) and check
that it prints the hash and tokens of the Python driver (`intdet generate`):
natively, and, when the Debian cross toolchains and qemu-user are installed,
as static aarch64 and s390x (big-endian) binaries run under qemu. Skipped with
the reason when a tool is missing. scripts/cross/build_and_run.sh does the
same from the command line.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from intdet.convert import convert
from intdet.generate import generate
from intdet.model import Engine, load_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CROSS_ARCHS = ("aarch64", "s390x")
APT_LINE = ("apt-get install -y --no-install-recommends cmake make g++ libxxhash-dev "
            "g++-aarch64-linux-gnu g++-s390x-linux-gnu qemu-user-static")
# (prompt ids, new tokens): the brief's prompt, and one whose tokens vary.
CASES = (([5, 17, 99], 16), ([1, 2, 3], 40), ([7], 40))


def _missing_build_tools() -> str | None:
    if not shutil.which("cmake"):
        return "cmake not found"
    if not (shutil.which("make") or shutil.which("ninja")):
        return "make/ninja not found"
    if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        return "no C++ compiler"
    if not any(os.path.isfile(os.path.join(d, "xxhash.h")) for d in ("/usr/include", "/usr/local/include")):
        return "xxhash.h not found (Debian: libxxhash-dev)"
    return None


def _build(build_dir: str, arch: str | None = None) -> str:
    """Configure and build only intdet_core + intdet_run; returns the binary."""
    args = ["cmake", "-S", ROOT, "-B", build_dir, "-DINTDET_PYTHON=OFF", "-DINTDET_TOOLS=ON",
            "-DCMAKE_BUILD_TYPE=Release"]
    if arch:
        cxx = f"{arch}-linux-gnu-g++"
        gomp = subprocess.run([cxx, "-print-file-name=libgomp.a"], capture_output=True, text=True).stdout.strip()
        # Static so qemu-user needs no sysroot; CMake's OpenMP module would pick libgomp.so.
        args += ["-DCMAKE_SYSTEM_NAME=Linux", f"-DCMAKE_SYSTEM_PROCESSOR={arch}", f"-DCMAKE_CXX_COMPILER={cxx}",
                 "-DCMAKE_EXE_LINKER_FLAGS=-static", f"-DOpenMP_gomp_LIBRARY={gomp}"]
    for cmd in (args, ["cmake", "--build", build_dir, "--target", "intdet_run", "-j", str(os.cpu_count() or 2)]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return os.path.join(build_dir, "intdet_run")


def _run_tool(runner: list, model_dir: str, ids, n: int, *extra) -> dict:
    cmd = runner + [model_dir, "--ids", ",".join(map(str, ids)), "-n", str(n), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr}"
    out = dict(line.split(" ", 1) if " " in line else (line, "") for line in r.stdout.splitlines())
    return {"hash": out["hash"], "tokens": [int(t) for t in out["tokens"].split(",") if t], "stop": out["stop"],
            "stderr": r.stderr}


@pytest.fixture(scope="module")
def models_and_expected(tmp_path_factory, tiny_qwen3_hf, tiny_llama_hf, tiny_qwen2_hf):
    """Converted tiny models (qwen3: tied + q/k norm; llama: untied lm_head;
    qwen2: q/k/v bias) and the Python driver's (hash, tokens, stop) per case."""
    root = tmp_path_factory.mktemp("cross_models")
    out = {}
    for name, src in (("qwen3", tiny_qwen3_hf), ("llama", tiny_llama_hf), ("qwen2", tiny_qwen2_hf)):
        d = str(root / name)
        convert(src, d, progress=False)
        lm = load_model(d)
        eng = Engine(lm)
        exp = {}
        for ids, n in CASES:
            g = generate(eng, ids, n, eos_ids=lm.tok_meta.get("eos_token_ids") or [])
            exp[(tuple(ids), n)] = (g.hash, g.tokens, g.stop)
        out[name] = (d, exp)
    return out


def _check_all(runner, models_and_expected, *extra):
    seen = []
    for name, (d, exp) in models_and_expected.items():
        for (ids, n), (h, toks, stop) in exp.items():
            got = _run_tool(runner, d, ids, n, *extra)
            assert (got["hash"], got["tokens"], got["stop"]) == (h, toks, stop), (name, ids, n, got["stderr"])
            seen.append(got["stderr"])
    return seen


@pytest.fixture(scope="module")
def native_tool(tmp_path_factory):
    why = _missing_build_tools()
    if why:
        pytest.skip(f"cannot build csrc/tools/intdet_run: {why}")
    return _build(str(tmp_path_factory.mktemp("intdet_run_native")))


def test_native_tool_matches_python(native_tool, models_and_expected):
    _check_all([native_tool], models_and_expected)
    # Thread count and kernel set change no bit.
    _check_all([native_tool], models_and_expected, "--threads", "1", "--isa", "scalar")


def test_native_tool_sha256_option_and_errors(native_tool, models_and_expected, tmp_path):
    import hashlib

    d, exp = models_and_expected["qwen3"]
    (ids, n), (h, _, _) = next(iter(exp.items()))
    with open(os.path.join(d, "model.safetensors"), "rb") as f:
        data = f.read()
    sha = hashlib.sha256(data).hexdigest()
    assert _run_tool([native_tool], d, ids, n, "--model-sha256", sha)["hash"] == h
    assert _run_tool([native_tool], d, ids, n, "--model-sha256", "0" * 64)["hash"] != h
    # A truncated file is refused with the path and the problem, never read past its end.
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    r = subprocess.run([native_tool, str(bad), "--ids", "1", "-n", "1"], capture_output=True, text=True)
    assert r.returncode == 1 and "model.safetensors" in r.stderr and "error" in r.stderr, r.stderr
    r = subprocess.run([native_tool, d, "--ids", "1,999", "-n", "1"], capture_output=True, text=True)
    assert r.returncode == 1 and "outside the vocabulary" in r.stderr, r.stderr


@pytest.mark.parametrize("arch", CROSS_ARCHS)
def test_cross_arch_matches_python(arch, models_and_expected, tmp_path_factory):
    if os.uname().machine == arch:
        pytest.skip(f"host is {arch}: covered by the native test")
    why = _missing_build_tools()
    if why:
        pytest.skip(f"cannot build: {why}")
    if not shutil.which(f"{arch}-linux-gnu-g++"):
        pytest.skip(f"no {arch}-linux-gnu-g++ (install: {APT_LINE})")
    qemu = shutil.which(f"qemu-{arch}-static") or shutil.which(f"qemu-{arch}")
    if not qemu:
        pytest.skip(f"no qemu-{arch}-static / qemu-{arch} (install: {APT_LINE})")
    tool = _build(str(tmp_path_factory.mktemp(f"intdet_run_{arch}")), arch)
    seen = _check_all([qemu, "-L", f"/usr/{arch}-linux-gnu", tool], models_and_expected)
    endian = "big-endian" if arch == "s390x" else "little-endian"
    assert all(endian in s for s in seen), seen[0]
    if arch == "aarch64":  # the NEON kernels are the default there; check scalar too
        assert all("isa neon" in s for s in seen), seen[0]
        _check_all([qemu, "-L", f"/usr/{arch}-linux-gnu", tool], models_and_expected, "--isa", "scalar")
