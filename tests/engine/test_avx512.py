"""The AVX-512 VNNI kernel set (csrc/cpu/x86/avx512*.cpp) against the scalar
set, bit for bit: natively where this CPU runs it, and on every x86-64 CPU
with AVX2 through the test module intdet._core_simde (the same kernel source
compiled against SIMDe's portable intrinsics; CMakeLists.txt). Linear
layers (int8 and int4 weights, decode and prefill tiles) on shapes across
the tile boundaries and the largest accumulations the bounds allow, whole
models against the pinned digests and the scalar chain hash, and the
one-line error where the CPU lacks the set."""

import contextlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import models
from conftest import ISAS, using_isa
from intdet import _core
from intdet.convert import convert
from intdet.hashing import ChainHash
from intdet.model import Engine, load_model

try:
    from intdet import _core_simde
except ImportError as e:  # built only where SIMDe's headers were found
    _core_simde = None
    _SIMDE_WHY = str(e)

NATIVE = "avx512" in ISAS


def simde_module():
    """intdet._core_simde, or a skip (a failure under INTDET_REQUIRE_SIMDE=1, as in CI)."""
    if _core_simde is None:
        if os.environ.get("INTDET_REQUIRE_SIMDE"):
            pytest.fail(f"intdet._core_simde was not built ({_SIMDE_WHY}): install simde-py or libsimde-dev")
        pytest.skip(f"intdet._core_simde not built ({_SIMDE_WHY})")
    return _core_simde


@contextlib.contextmanager
def on_isa(mod, isa, threads=None):
    """Run the block with mod's kernel set `isa` active (and `threads`
    threads), then restore mod's set and thread count."""
    before = (mod.isa(), mod.num_threads())
    try:
        mod.set_isa(isa)
        if threads is not None:
            mod.set_num_threads(threads)
        yield mod
    finally:
        mod.set_isa(before[0])
        mod.set_num_threads(before[1])


def on_avx512(mod, threads=None):
    """Run the block with mod's avx512 set active (and `threads` threads)."""
    return on_isa(mod, "avx512", threads)


@pytest.fixture(params=[pytest.param("simde", marks=pytest.mark.simde)] + (["native"] if NATIVE else []))
def avx512(request):
    """The module whose avx512 set is under test, that set active: the SIMDe
    build everywhere, intdet._core itself where the CPU runs AVX-512."""
    mod = simde_module() if request.param == "simde" else _core
    with on_avx512(mod):
        assert mod.isa() == "avx512"
        yield mod


@pytest.mark.simde
def test_simde_build_has_the_set():
    assert "avx512" in simde_module().available_isas()


# ---------------------------------------------------------------- linear layers

I16 = 32767  # quant16_row's range: +-32767


def ramp(rng, shape, lo, hi):
    """Random values with the extremes lo and hi planted in every row."""
    x = rng.integers(lo, hi + 1, shape)
    flat = x.reshape(-1, shape[-1])
    for r in range(flat.shape[0]):
        idx = rng.permutation(shape[-1])
        flat[r, idx[: max(1, shape[-1] // 8)]] = lo
        flat[r, idx[max(1, shape[-1] // 8): max(2, shape[-1] // 4)]] = hi
    return x


def scales(rng, N):
    mant = rng.integers(1, 1 << 20, N).astype(np.int32)
    shift = rng.integers(16, 44, N).astype(np.int32)
    return mant, shift


def check_linear(mod, q, e, w, mant, shift):
    got = mod.ops.linear(q, e, w, mant, shift)
    with using_isa("scalar"):
        want = _core.ops.linear(q, e, w, mant, shift)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def check_linear_w4(mod, q, e, w4, gd, gm, mant, shift):
    got = mod.ops.linear_w4(q, e, w4, gd, gm, mant, shift)
    with using_isa("scalar"):
        want = _core.ops.linear_w4(q, e, w4, gd, gm, mant, shift)
    assert got.dtype == want.dtype and np.array_equal(got, want)


# T 1..200 covers decode (T <= 2), the tail tiles of every tile height and
# several 96-token chunks; K past 512 crosses the int32 block of 256 pairs;
# N not a multiple of 16 exercises the padded last channel group.
SHAPES = st.tuples(st.integers(1, 200), st.integers(1, 600), st.integers(1, 90))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(SHAPES, st.integers(0, 2**32 - 1))
def test_linear_int8_matches_scalar(avx512, shape, seed):
    T, K, N = shape
    rng = np.random.default_rng(seed)
    q = ramp(rng, (T, K), -I16, I16).astype(np.int16)
    w = ramp(rng, (N, K), -128, 127).astype(np.int8)
    e = rng.integers(0, 12, T).astype(np.int32)
    check_linear(avx512, q, e, w, *scales(rng, N))


@pytest.mark.parametrize("T", [1, 2, 3, 7, 13])
@pytest.mark.parametrize("K", [512, 513, 1024, 1031])
@pytest.mark.parametrize("sign", [1, -1])
def test_linear_int8_largest_accumulation(avx512, T, K, sign):
    """Every product at its largest magnitude, 32767 * 128, all of one sign:
    each block of 512 inputs reaches 2147418112 (the int32 bound the kernels
    rely on) and the int64 sum crosses 2^31."""
    N = 37
    rng = np.random.default_rng(K + T)
    q = np.full((T, K), sign * I16, np.int16)
    w = np.full((N, K), -128, np.int8)
    w[1::2] = 127  # odd channels: the largest positive weight
    e = np.zeros(T, np.int32)
    check_linear(avx512, q, e, w, *scales(rng, N))


W4_MAX = 2047  # |gd * u + gm| (docs/format.md)


def w4_weights(rng, N, K, extreme=None):
    """Codes, steps and offsets with |w| <= 2047 everywhere; `extreme` +1/-1:
    every weight at +2047 / -2047 (codes 15 and 0)."""
    G = K // 32
    if extreme is None:
        gd = rng.integers(0, W4_MAX // 15 + 1, (N, G))
        gm = rng.integers(-W4_MAX, W4_MAX - 15 * gd + 1)
        codes = rng.integers(0, 16, (N, K))
        codes[:, ::5] = 15
    else:
        gd = np.full((N, G), 136)
        gm = np.full((N, G), 7 if extreme > 0 else -W4_MAX)
        codes = np.full((N, K), 15 if extreme > 0 else 0)
    w = gd.repeat(32, 1) * codes + gm.repeat(32, 1)
    assert np.abs(w).max() <= W4_MAX
    w4 = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return w4, gd.astype(np.int16), gm.astype(np.int16)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 200), st.integers(1, 12), st.integers(1, 90), st.integers(0, 2**32 - 1))
def test_linear_int4_matches_scalar(avx512, T, groups, N, seed):
    K = 32 * groups
    rng = np.random.default_rng(seed)
    q = ramp(rng, (T, K), -I16, I16).astype(np.int16)
    e = rng.integers(0, 12, T).astype(np.int32)
    check_linear_w4(avx512, q, e, *w4_weights(rng, N, K), *scales(rng, N))


@pytest.mark.parametrize("T", [1, 2, 5, 8, 13])
@pytest.mark.parametrize("extreme", [1, -1])
@pytest.mark.parametrize("sign", [1, -1])
def test_linear_int4_largest_accumulation(avx512, T, extreme, sign):
    """Every weight at +-2047 and every activation at +-32767: each group of
    32 reaches 32 * 32767 * 2047 (the int32 bound of prefill's blocks) and
    decode's code sums their largest, 32 * 32767 * 15."""
    K, N = 32 * 40, 45
    rng = np.random.default_rng(T)
    q = np.full((T, K), sign * I16, np.int16)
    e = np.zeros(T, np.int32)
    check_linear_w4(avx512, q, e, *w4_weights(rng, N, K, extreme), *scales(rng, N))


# ---------------------------------------------------------------- whole models


def simde_engine(lm):
    """An Engine whose forwards run in intdet._core_simde (the model loaded
    there by the one loader, packed for its kernel sets)."""
    from intdet import backends

    mod = simde_module()
    eng = Engine.__new__(Engine)  # the module has the cpu backend's API
    eng.lm, eng.device, eng.backend, eng.spec = lm, "cpu", mod, backends.spec("cpu")
    eng._model = mod.Model(lm.cfg, lm.tensors, mapped=lm.st is not None, config_path=lm.cfg_path or "config.json",
                           tensors_path=lm.st_path or "model.safetensors")
    return eng


@pytest.mark.parametrize("name,weights,threads", [
    ("llama-hf", "int8", 1), ("qwen2-hf", "int8", 2), ("qwen3-hf", "int8", 3),
    ("llama-gguf-q4_1", "int8", 2), ("llama-gguf-q4_1", "int4", 1), ("llama-gguf-q4_1", "int4", 3)])
@pytest.mark.simde
def test_models_give_the_pinned_digests_on_simde(name, weights, threads, tmp_path):
    """The test models' pinned logits (tests/engine/test_logits_golden.py) from the
    avx512 set in the SIMDe build: prompt positions and 16 greedy steps."""
    from test_logits_golden import GOLDEN, PROMPT, SOURCES, logits_digest

    mod = simde_module()
    src = SOURCES[name](str(tmp_path))
    lm = load_model(convert(src, str(tmp_path / "out"), progress=False, weights=weights))
    with on_avx512(mod, threads):
        assert logits_digest(simde_engine(lm), PROMPT) == GOLDEN[f"{name}/{weights}"]


def chain_hash(engine, lm, prompt, steps):
    h = ChainHash(lm.cfg["format_version"], lm.model_sha256, prompt)
    seq = engine.new_state(len(prompt) + steps)
    lg = seq.forward(prompt)
    for _ in range(steps):
        tok = int(np.argmax(lg))
        h.update(lg, tok)
        lg = seq.forward([tok])
    return h.hex()


@pytest.mark.parametrize("weights,head_dim", [("int8", 32), ("int4", 32), ("int8", 64)])
@pytest.mark.simde
def test_chain_hash_matches_scalar_on_simde(weights, head_dim, tmp_path):
    """Greedy generation's chain hash, the avx512 set (SIMDe build, 2 threads)
    against the scalar set (1 thread), on models with int4-able shapes whose
    heads take the avx512 attention (32 dims: one-chunk P.V passes, 64: two;
    the pinned models' 48-dim heads take the AVX2 kernel)."""
    shape = dict(models.INT4_SHAPE, head_dim=head_dim)
    src = models.write_hf_model(str(tmp_path / "src"), "qwen3", **shape)
    lm = load_model(convert(src, str(tmp_path / "m"), progress=False, weights=weights))
    prompt = [5, 17, 99, 230, 41, 7, 300, 12, 64, 128, 3, 77, 1, 2, 250, 9, 33]
    with using_isa("scalar", 1):
        want = chain_hash(Engine(lm, "cpu"), lm, prompt, 12)
    with on_avx512(simde_module(), 2):
        assert chain_hash(simde_engine(lm), lm, prompt, 12) == want


# ---------------------------------------------------------------- where the CPU lacks it

lacks = pytest.mark.skipif(NATIVE, reason="this CPU runs AVX-512 VNNI")


@lacks
def test_set_isa_avx512_names_the_missing_cpu_feature():
    with pytest.raises(ValueError) as info:
        _core.set_isa("AVX512")
    assert str(info.value) == f"ISA 'AVX512': this CPU lacks it (choose {', '.join(ISAS)})"


@lacks
def test_intdet_isa_avx512_is_a_one_line_error(tmp_path):
    env = dict(os.environ, INTDET_ISA="avx512")
    r = subprocess.run([sys.executable, "-c", "from intdet import _core\n_core.kernels_ready()"], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        f"ValueError: INTDET_ISA=avx512: this CPU lacks it (choose {', '.join(ISAS)})"), r.stderr
    # the CLI: one line, exit 1, no traceback
    m = convert(models.write_hf_model(str(tmp_path / "src"), "llama"), str(tmp_path / "m"), progress=False)
    env.update(INTDET_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "intdet.cli", "generate", "--ids", "1,2,3", "-n", "1", "-m", m],
                       env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r
    assert r.stderr.splitlines() == [
        f"intdet: error: INTDET_ISA=avx512: this CPU lacks it (choose {', '.join(ISAS)})"], r.stderr


@pytest.mark.skipif(not NATIVE or "amx" in ISAS, reason="this CPU lacks AVX-512 VNNI, or has AMX (test_amx.py)")
def test_native_set_is_the_default():
    r = subprocess.run([sys.executable, "-c", "from intdet import _core\nprint(_core.isa())"],
                       env={k: v for k, v in os.environ.items() if k != "INTDET_ISA"}, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "avx512", r.stderr


# ---------------------------------------------------------------- scripts/bench_cpu.py --isa

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "bench_cpu.py")


def _bench_cpu():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_cpu", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_cpu_table_for_two_kernel_sets():
    """--isa avx2 --isa avx512: a column per set, each against llama.cpp, and avx512 against avx2."""
    def eng(p, d, mib):
        return {"prefill_tok_s": p, "decode_tok_s": d, "peak_rss_bytes": mib * 2**20}

    res = {"model": "M", "note": "intdet: int8; llama.cpp: Q8_0", "prompt_tokens": 512, "gen_tokens": 128,
           "repeats": 3, "intdet_isa": "avx2", "llama_cpp_version": "0.3.16",
           "rows": [{"threads": 2, "intdet": eng(800.0, 40.0, 300), "llama": eng(400.0, 50.0, 250),
                     "intdet_by_isa": {"avx2": eng(800.0, 40.0, 300), "avx512": eng(1400.0, 60.0, 310)},
                     "greedy_tokens_agree": 17}]}
    assert _bench_cpu().format_result(res) == """\
M: intdet: int8; llama.cpp: Q8_0
prompt 512 tok, decode 128 tok (batch 1, greedy), median of 3; intdet kernel sets avx2, avx512, llama-cpp-python 0.3.16
threads  metric        intdet avx2  intdet avx512  llama.cpp  avx2/llama.cpp  avx512/llama.cpp  avx512/avx2
      2  pp512 tok/s         800.0         1400.0      400.0            2.00              3.50         1.75
      2  tg128 tok/s          40.0           60.0       50.0            0.80              1.20         1.50
      2  peak RSS MiB          300            310        250            1.20              1.24         1.03
greedy decode tokens equal between the engines from the start: threads 2: 17/128"""


def test_bench_cpu_worker_runs_the_named_set(tmp_path, tiny_llama_hf):
    model = convert(tiny_llama_hf, str(tmp_path / "m"), progress=False)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"model": model, "ids": [5, 6, 7, 8, 9, 10, 11, 12, 13], "gen": 2, "threads": 1,
                                "isa": "scalar"}))
    r = subprocess.run([sys.executable, BENCH, "--worker", "intdet", str(spec)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("BENCH_RESULT ")]
    assert json.loads(line[len("BENCH_RESULT "):])["isa"] == "scalar"


@lacks
def test_bench_cpu_refuses_a_set_the_cpu_lacks():
    r = subprocess.run([sys.executable, BENCH, "--isa", "avx512"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        f"bench_cpu.py: error: --isa avx512: not a kernel set this build and CPU run (choose {', '.join(ISAS)})")
