"""The chain hash on other CPU architectures and byte orders.

csrc/tools/intdet_run is a standalone C++ greedy generator (no Python) that
reads a converted model directory itself and prints the chain hash of
docs/chain-hash.md. These tests build it with CMake (INTDET_TOOLS=ON) and check
that it prints the hash and tokens of the Python driver (`intdet generate`):
natively, and, when the Debian cross toolchains and qemu-user are installed,
as static aarch64 and s390x (big-endian) binaries run under qemu. Every model runs
in both weight formats' code paths: int8 (qwen3, llama, qwen2) and int4
(`--weights int4`, qwen3). Skipped with the reason when a tool is missing. scripts/cross/build_and_run.sh does the
same from the command line.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess

import models
import pytest

from intdet.convert import convert
from intdet.errors import IntdetError
from oracle import generate
from intdet.model import Engine, load_model

pytestmark = [pytest.mark.cross, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


_CROSS_TOOLS: dict = {}


def _cross_tool(arch: str, tmp_path_factory) -> str:
    """intdet_run for `arch`, built once per session (the hash and the
    compress tests share it)."""
    if arch not in _CROSS_TOOLS:
        _CROSS_TOOLS[arch] = _build(str(tmp_path_factory.mktemp(f"intdet_run_{arch}")), arch)
    return _CROSS_TOOLS[arch]


def _cross_runner(arch: str, tmp_path_factory) -> list:
    """[qemu, -L, sysroot, tool] for `arch`, or pytest.skip with the reason."""
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
    return [qemu, "-L", f"/usr/{arch}-linux-gnu", _cross_tool(arch, tmp_path_factory)]


def _run_tool(runner: list, model_dir: str, ids, n: int, *extra) -> dict:
    cmd = runner + [model_dir, "--ids", ",".join(map(str, ids)), "-n", str(n), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr}"
    out = dict(line.split(" ", 1) if " " in line else (line, "") for line in r.stdout.splitlines())
    return {"hash": out["hash"], "tokens": [int(t) for t in out["tokens"].split(",") if t], "stop": out["stop"],
            "stderr": r.stderr}


@pytest.fixture(scope="module")
def models_and_expected(tmp_path_factory, tiny_qwen3_hf, tiny_llama_hf, tiny_qwen2_hf, tiny_gemma3_hf):
    """Converted tiny models (qwen3: tied + q/k norm; llama: untied lm_head;
    qwen2: q/k/v bias; qwen3_int4: int4 linear weights, --weights int4;
    qwen3_all: every optional feature, q/k/v/o biases + q/k norm + untied;
    gemma3: post-norms, GeGLU, sliding window, two RoPE tables, Q10 residual)
    and the Python driver's (hash, tokens, stop) per case."""
    root = tmp_path_factory.mktemp("cross_models")
    int4_src = models.write_hf_model(str(root / "hf_qwen3_int4"), "qwen3", **models.INT4_SHAPE)
    all_src = models.write_hf_model(str(root / "hf_qwen3_all"), "qwen3", attention_bias=True, tie_word_embeddings=False)
    out = {}
    for name, src, weights in (("qwen3", tiny_qwen3_hf, "int8"), ("llama", tiny_llama_hf, "int8"),
                               ("qwen2", tiny_qwen2_hf, "int8"), ("qwen3_int4", int4_src, "int4"),
                               ("qwen3_all", all_src, "int8"), ("gemma3", tiny_gemma3_hf, "int8")):
        d = str(root / name)
        convert(src, d, progress=False, weights=weights)
        lm = load_model(d)
        assert lm.cfg.get("weight_format", "int8") == weights
        if weights == "int4":
            assert "blk.0.attn_q.q4" in lm.tensors and "blk.0.attn_q.q" not in lm.tensors
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
    runner = _cross_runner(arch, tmp_path_factory)
    seen = _check_all(runner, models_and_expected)
    endian = "big-endian" if arch == "s390x" else "little-endian"
    assert all(endian in s for s in seen), seen[0]
    if arch == "aarch64":  # the NEON kernels are the default there; check scalar too
        assert all("isa neon" in s for s in seen), seen[0]
        _check_all(runner, models_and_expected, "--isa", "scalar")


def _patch_tensor(st_path: str, name: str, index: int, fmt: str, value: int):
    """Overwrite element `index` of tensor `name` (struct format `fmt`, little-endian) in place."""
    with open(st_path, "r+b") as f:
        hlen = struct.unpack("<Q", f.read(8))[0]
        ent = json.loads(f.read(hlen))[name]
        f.seek(8 + hlen + ent["data_offsets"][0] + index * struct.calcsize(fmt))
        f.write(struct.pack("<" + fmt, value))


def test_native_tool_int4_load_errors(native_tool, models_and_expected, tmp_path):
    d, _ = models_and_expected["qwen3_int4"]

    def run(model_dir):
        return subprocess.run([native_tool, str(model_dir), "--ids", "1", "-n", "1"], capture_output=True, text=True)

    # A group whose step and offset are each in range but whose top code is not:
    # gm + 15 * gd = 1000 + 1500 > 2047. Refused by the tool and by the Python loader.
    bad = tmp_path / "bad_bound"
    shutil.copytree(d, bad)
    _patch_tensor(str(bad / "model.safetensors"), "blk.0.ffn_up.gd", 3, "h", 100)
    _patch_tensor(str(bad / "model.safetensors"), "blk.0.ffn_up.gm", 3, "h", 1000)
    r = run(bad)
    assert r.returncode == 1 and "blk.0.ffn_up" in r.stderr and "2047" in r.stderr, r.stderr
    with pytest.raises(IntdetError, match="2047"):
        load_model(str(bad))
    # A negative step is refused too (the bound assumes gd >= 0).
    neg = tmp_path / "bad_step"
    shutil.copytree(d, neg)
    _patch_tensor(str(neg / "model.safetensors"), "blk.1.attn_v.gd", 0, "h", -1)
    r = run(neg)
    assert r.returncode == 1 and "blk.1.attn_v" in r.stderr and "2047" in r.stderr, r.stderr

    def with_cfg(tag, **changes):
        m = tmp_path / tag
        shutil.copytree(d, m)
        cfg = json.loads((m / "config.json").read_text())
        for k, v in changes.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        (m / "config.json").write_text(json.dumps(cfg))
        return run(m)

    r = with_cfg("fmt_int2", weight_format="int2")
    assert r.returncode == 1 and "weight_format" in r.stderr and "int2" in r.stderr, r.stderr
    r = with_cfg("group_64", weight_group_size=64)
    assert r.returncode == 1 and "weight_group_size" in r.stderr, r.stderr
    # Without weight_format the model is int8, and its .q tensors are missing.
    r = with_cfg("fmt_absent", weight_format=None)
    assert r.returncode == 1 and "int4" in r.stderr and "weight_format" in r.stderr, r.stderr


# ------------------------------------------------------------------ intdet compress


@pytest.fixture(scope="module")
def compressed_chunks(models_and_expected, tmp_path_factory):
    """(model dir, [(payload file, start id, token ids)]) for chunks of a
    text compressed by intdet compress on this host (qwen3 and llama)."""
    import io

    from intdet.compress import codec
    from intdet.compress.chunking import TokenBytes
    from intdet.compress.container import read_chunk, read_header

    tmp_path = tmp_path_factory.mktemp("compressed_chunks")
    text = ("Integer logits decode on every machine: x86, ARM, s390x. " * 5).encode() + bytes(range(256))
    out = {}
    for name in ("qwen3", "llama"):
        d, _ = models_and_expected[name]
        eng = Engine(load_model(d))
        buf = io.BytesIO()
        codec.compress_stream(eng, io.BytesIO(text).read, buf, ctx=120, store_larger=False)
        f = io.BytesIO(buf.getvalue())
        h = read_header(f, "x")
        tb = TokenBytes(eng.lm.tokenizer, eng.lm.tok_meta, eng.vocab_size)
        chunks, at = [], 0
        for i in range(h.n_chunks):
            c = read_chunk(f, h, i, "x")
            p = tmp_path / f"{name}-{i}.bin"
            p.write_bytes(c.payload)
            ids, _ = tb.ids_of(text[at:at + c.orig_len])
            assert len(ids) == c.n_tokens
            chunks.append((str(p), h.start_id, ids))
            at += c.orig_len
        assert len(chunks) >= 2
        out[name] = (d, chunks)
    return out


def _check_chunks(runner, compressed_chunks, *extra):
    seen = []
    for name, (d, chunks) in compressed_chunks.items():
        for path, start, ids in chunks:
            cmd = runner + [d, "--decode-chunk", path, "--start", str(start), "-n", str(len(ids)), *extra]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, f"{' '.join(cmd)}: {r.stderr}"
            got = [int(t) for t in r.stdout.split(" ", 1)[1].split(",")]
            assert got == ids, (name, path)
            seen.append(r.stderr)
    return seen


def test_native_tool_decodes_compressed_chunks(native_tool, compressed_chunks):
    _check_chunks([native_tool], compressed_chunks)
    _check_chunks([native_tool], compressed_chunks, "--isa", "scalar", "--threads", "1")


@pytest.mark.parametrize("arch", CROSS_ARCHS)
def test_cross_arch_decodes_compressed_chunks(arch, compressed_chunks, tmp_path_factory):
    """A file compressed on this host decodes on aarch64 and big-endian s390x."""
    seen = _check_chunks(_cross_runner(arch, tmp_path_factory), compressed_chunks)
    assert all(("big-endian" if arch == "s390x" else "little-endian") in s for s in seen), seen[0]
