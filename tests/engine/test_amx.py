"""The AMX kernel set (csrc/cpu/x86/amx_gemm.cpp) against the scalar set,
bit for bit: natively where this CPU has AMX-INT8, and on every x86-64 CPU
with AVX2 through intdet._core_simde, where the same kernel source runs on
SIMDe and a tile emulation written from the instructions' definitions
(csrc/cpu/x86/amx_intrin.h). Its int8 linear layer takes AMX tiles on the
hi/lo planes for T >= 3 rows and AVX-512 VNNI on the same q16 weights for
fewer; shapes cross the 3-row, 16-row, 16-channel, 64-input and 4-input
boundaries, activations take every extreme of the hi/lo split, and K crosses
the tiles' int32 block of 32768 inputs."""

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
from intdet.model import Engine, load_model
from test_avx512 import I16, chain_hash, check_linear, on_isa, ramp, scales, simde_engine, simde_module

NATIVE = "amx" in ISAS
AMX_MIN_ROWS = 3  # kAmxMinRows (csrc/cpu/x86/amx.h)


def on_amx(mod, threads=None):
    return on_isa(mod, "amx", threads)


@pytest.fixture(params=[pytest.param("simde", marks=pytest.mark.simde)] + (["native"] if NATIVE else []))
def amx(request):
    """The module whose amx set is under test, that set active: the SIMDe
    build (emulated tiles) everywhere, intdet._core where the CPU has AMX."""
    mod = simde_module() if request.param == "simde" else _core
    with on_amx(mod):
        assert mod.isa() == "amx"
        yield mod


@pytest.mark.simde
def test_simde_build_has_the_set_last():
    assert simde_module().available_isas()[-2:] == ["avx512", "amx"]


# T 1..200: VNNI below 3 rows, AMX tiles from 3 (a partial last block of
# 16 rows unless T is a multiple of 16); K 1..600: partial quads and partial
# 64-input tile steps; N 1..90: one or two 16-channel groups per tile, the
# last group partial.
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.tuples(st.integers(1, 200), st.integers(1, 600), st.integers(1, 90)), st.integers(0, 2**32 - 1))
def test_linear_int8_matches_scalar(amx, shape, seed):
    T, K, N = shape
    rng = np.random.default_rng(seed)
    q = ramp(rng, (T, K), -I16, I16).astype(np.int16)
    w = ramp(rng, (N, K), -128, 127).astype(np.int8)
    e = rng.integers(0, 12, T).astype(np.int32)
    check_linear(amx, q, e, w, *scales(rng, N))


# The split x = 256 * hi + lo at its corners: 32767 = (127, 255), -32767 =
# (-128, 1), -1 = (-1, 255), 255 = (0, 255), -256 = (-1, 0).
@pytest.mark.parametrize("x", [I16, -I16, -1, 255, -256])
@pytest.mark.parametrize("T", [1, 2, 3, 7, 8, 15, 16, 17, 33])
@pytest.mark.parametrize("K", [1027, 2048])
def test_linear_int8_largest_accumulation(amx, x, T, K):
    """Every activation x and every weight -128 (even channels) or 127 (odd):
    VNNI's 256-quad blocks at their bound and the int64 sum past 2^31."""
    N = 37
    rng = np.random.default_rng(K + T)
    q = np.full((T, K), x, np.int16)
    w = np.full((N, K), -128, np.int8)
    w[1::2] = 127
    check_linear(amx, q, np.zeros(T, np.int32), w, *scales(rng, N))


def test_linear_int8_crosses_the_tile_block(amx):
    """K = 32768 + 70 inputs: two int32 tile blocks, each at the largest
    sums the bound allows (hi = -128 or 127 against w = -128)."""
    T, K, N = AMX_MIN_ROWS + 1, 32768 + 70, 20
    rng = np.random.default_rng(7)
    q = np.full((T, K), -I16, np.int16)
    q[1::2] = I16
    q[:, ::9] = -1
    w = np.full((N, K), -128, np.int8)
    check_linear(amx, q, np.zeros(T, np.int32), w, *scales(rng, N))


def test_packed_rows_read_back_q16(amx):
    """The q16 row reader (the embedding from a tied head's packed copy)."""
    rng = np.random.default_rng(3)
    for N, K in [(1, 1), (17, 63), (40, 64), (33, 130)]:
        w = rng.integers(-128, 128, (N, K)).astype(np.int8)
        assert np.array_equal(amx.ops.packed_rows(w), w)


@pytest.mark.parametrize("name,weights,threads", [
    ("llama-hf", "int8", 1), ("qwen2-hf", "int8", 2), ("llama-gguf-q4_1", "int4", 3)])
@pytest.mark.simde
def test_models_give_the_pinned_digests_on_simde(name, weights, threads, tmp_path):
    """The pinned logits (tests/engine/test_logits_golden.py) from the amx set in the
    SIMDe build: prompt positions (AMX tiles where the prompt has 16 rows or
    more) and greedy steps (VNNI on q16)."""
    from test_logits_golden import GOLDEN, PROMPT, SOURCES, logits_digest

    mod = simde_module()
    src = SOURCES[name](str(tmp_path))
    lm = load_model(convert(src, str(tmp_path / "out"), progress=False, weights=weights))
    with on_amx(mod, threads):
        assert logits_digest(simde_engine(lm), PROMPT) == GOLDEN[f"{name}/{weights}"]


@pytest.mark.simde
def test_chain_hash_matches_scalar(tmp_path):
    """Greedy generation from a 40-token prompt (two 16-row tile blocks and a
    partial one), amx against scalar: the SIMDe build at 2 threads, and the
    native set at 3 where the CPU has it."""
    shape = dict(models.INT4_SHAPE, head_dim=64)
    src = models.write_hf_model(str(tmp_path / "src"), "qwen3", **shape)
    lm = load_model(convert(src, str(tmp_path / "m"), progress=False))
    prompt = [(7 * i + 3) % 300 for i in range(40)]
    with using_isa("scalar", 1):
        want = chain_hash(Engine(lm, "cpu"), lm, prompt, 10)
    with on_amx(simde_module(), 2):
        assert chain_hash(simde_engine(lm), lm, prompt, 10) == want
    if NATIVE:
        with using_isa("amx", 3):
            assert chain_hash(Engine(lm, "cpu"), lm, prompt, 10) == want


lacks = pytest.mark.skipif(NATIVE, reason="this CPU has AMX-INT8")


@lacks
def test_intdet_isa_amx_is_a_one_line_error():
    env = dict(os.environ, INTDET_ISA="amx")
    r = subprocess.run([sys.executable, "-c", "from intdet import _core\n_core.kernels_ready()"], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        f"ValueError: INTDET_ISA=amx: this CPU lacks it (choose {', '.join(ISAS)})"), r.stderr


@pytest.mark.skipif(not NATIVE, reason="this CPU lacks AMX-INT8")
def test_native_set_is_the_default():
    r = subprocess.run([sys.executable, "-c", "from intdet import _core\nprint(_core.isa())"],
                       env={k: v for k, v in os.environ.items() if k != "INTDET_ISA"}, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "amx", r.stderr


@pytest.mark.skipif(not NATIVE, reason="this CPU lacks AMX-INT8")
def test_tiles_run_on_every_pool_thread(tmp_path):
    """Each thread loads the tile configuration itself: a prefill at 3 threads
    (tiles on every pool worker), in a fresh process so no thread had tiles
    before, gives the scalar logits."""
    src = models.write_hf_model(str(tmp_path / "src"), "llama")
    m = convert(src, str(tmp_path / "m"), progress=False)
    code = (
        "import sys, numpy as np\nfrom intdet import _core\nfrom intdet.model import Engine, load_model\n"
        "lm = load_model(sys.argv[1])\nids = list(range(1, 65))\n"
        "_core.set_isa('scalar'); _core.set_num_threads(1)\n"
        "want = Engine(lm, 'cpu').new_state(64).forward(ids)\n"
        "_core.set_isa('amx'); _core.set_num_threads(3)\n"
        "got = Engine(lm, 'cpu').new_state(64).forward(ids)\n"
        "print(bool(np.array_equal(got, want)))\n")
    r = subprocess.run([sys.executable, "-c", code, m], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"
