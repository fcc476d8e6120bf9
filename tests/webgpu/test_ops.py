"""Each WebGPU kernel bit for bit against the numpy spec op
(python/intdet/ref/ops.py) and, where intdet._core binds it, the C++ op;
the dot-product kernels with dot4I8Packed and with its shift fallback."""

import numpy as np
import pytest

from intdet import _core
from intdet.ref import intmath, ops
import gpu_ops as G
from intdet.webgpu.kernels import Kernels

C = _core.ops


@pytest.fixture(scope="module")
def kern_both():
    return {}


@pytest.fixture
def k(dot4, kern_both):
    if dot4 not in kern_both:
        kern_both[dot4] = Kernels(dot4=dot4)
    return kern_both[dot4]


def rng_for(*seed):
    return np.random.default_rng(list(seed))


def wide(rng, shape, bits):
    """int64 values spread over magnitudes up to 2^bits (every size of row maximum)."""
    mag = rng.integers(0, bits + 1, size=shape)
    return (rng.integers(-(2**40), 2**40, size=shape) >> (40 - np.minimum(mag, 40))).astype(np.int64)


@pytest.mark.parametrize("seed", range(3))
def test_quant16(k, seed):
    rng = rng_for(seed)
    for bits in (0, 14, 15, 16, 31, 47, 62):
        x = wide(rng, (5, 37), min(bits, 40)) << max(0, bits - 40)
        x[0] = 0
        q, e = G.quant16(k, x)
        wq, we = intmath.quant16(x)
        assert np.array_equal(q, wq) and np.array_equal(e, we), bits
        cq, ce = C.quant16(x)
        assert np.array_equal(q, cq) and np.array_equal(e, ce)


@pytest.mark.parametrize("in_frac", [10, 16])
@pytest.mark.parametrize("n", [48, 72, 200])
def test_rms_norm(k, n, in_frac):
    rng = rng_for(n, in_frac)
    x = wide(rng, (9, n), 31).clip(-(2**31 - 1), 2**31 - 1)
    x[0] = 0
    x[1, :] = 0
    x[1, 3] = 1  # a one-bit maximum: the largest pre-shift
    g = rng.integers(-(2**14), 2**14, size=n).astype(np.int16)
    for eps in (0, 96, 1 << 40, (1 << 62) - 1):
        got = G.rms_norm(k, x, g, eps, in_frac)
        assert np.array_equal(got, ops.rms_norm(x, g.astype(np.int64), eps, in_frac)), eps
        assert np.array_equal(got, C.rms_norm(x, g, eps, in_frac))


@pytest.mark.parametrize("n", [48, 200])
def test_rms_norm_quant16(k, n):
    """The fused pre-norm: the rows rms_norm gives and their quant16, from rows in0.. into rows out0..."""
    rng = rng_for(n, 3)
    x = wide(rng, (7, n), 31).clip(-(2**31 - 1), 2**31 - 1)
    x[2] = 0
    g = rng.integers(-(2**14), 2**14, size=n).astype(np.int16)
    for eps, in0, out0 in ((0, 0, 0), (96, 2, 3), ((1 << 62) - 1, 1, 0)):
        y, q, e = G.rms_norm_quant16(k, x, g, eps, 16, in0, out0)
        want = ops.rms_norm(x[in0:], g.astype(np.int64), eps, 16)
        wq, we = intmath.quant16(want)
        assert np.array_equal(y, want) and np.array_equal(q, wq) and np.array_equal(e, we), (eps, in0, out0)


@pytest.mark.parametrize("coop", [False, True], ids=["channel", "coop"])
@pytest.mark.parametrize("K", [72, 136, 300, 2048])
def test_linear_int8(k, K, coop):
    rng = rng_for(K)
    T, N = 3, 37
    q = rng.integers(-32767, 32768, size=(T, K))
    q[0] = 32767
    e = rng.integers(0, 20, size=T)
    w = rng.integers(-127, 128, size=(N, K)).astype(np.int8)
    w[0] = 127
    w[1] = -127
    mant = rng.integers(1, 2**15 + 1, size=N).astype(np.int32)
    shift = rng.integers(10, 50, size=N).astype(np.int32)
    bias = rng.integers(-(2**31) + 1, 2**31, size=N).astype(np.int32)
    got = G.linear(k, q, e, w, mant, shift, coop=coop)
    want = ops.linear(q, e, w, mant, shift)
    assert np.array_equal(got, want)
    assert np.array_equal(got, C.linear(q.astype(np.int16), e.astype(np.int32), w, mant, shift))
    assert np.array_equal(G.linear(k, q, e, w, mant, shift, bias, coop=coop), ops.linear(q, e, w, mant, shift, bias))


@pytest.mark.parametrize("coop", [False, True], ids=["channel", "coop"])
@pytest.mark.parametrize("nparts", [2, 3])
def test_linear_int8_segments(k, nparts, coop):
    """q, k, v (or gate, up) as one matrix in one dispatch, a bias on one of them: each output
    is its own linear's."""
    rng = rng_for(nparts, 8)
    T, K = 3, 136
    q = rng.integers(-32767, 32768, size=(T, K))
    e = rng.integers(0, 20, size=T)
    parts = []
    for i, N in enumerate((37, 8, 21)[:nparts]):
        w = rng.integers(-127, 128, size=(N, K)).astype(np.int8)
        mant = rng.integers(1, 2**15 + 1, size=N).astype(np.int32)
        shift = rng.integers(10, 50, size=N).astype(np.int32)
        bias = rng.integers(-(2**31) + 1, 2**31, size=N).astype(np.int32) if i == 1 else None
        parts.append((w, mant, shift, bias))
    for got, (w, mant, shift, bias) in zip(G.linear_segments(k, q, e, parts, coop), parts):
        assert np.array_equal(got, ops.linear(q, e, w, mant, shift, bias))


@pytest.mark.parametrize("K", [32, 96, 2080])
def test_linear_int4(k, K):
    rng = rng_for(K, 4)
    T, N, Gs = 2, 13, K // 32
    q = rng.integers(-32767, 32768, size=(T, K))
    q[0] = -32767
    e = rng.integers(0, 20, size=T)
    codes = rng.integers(0, 256, size=(N, K // 2)).astype(np.uint8)
    gd = rng.integers(0, 137, size=(N, Gs)).astype(np.int16)
    gm = rng.integers(-2047, 2047 - 15 * 136, size=(N, Gs)).astype(np.int16)
    codes[0], gd[0], gm[0] = 0xFF, 1, 2032  # every weight +2047: the group sum at its bound
    mant = rng.integers(1, 2**15 + 1, size=N).astype(np.int32)
    shift = rng.integers(20, 50, size=N).astype(np.int32)
    w = ops.dequant_int4(codes, gd, gm)
    assert np.abs(w).max() <= 2047
    got = G.linear(k, q, e, None, mant, shift, w4=(codes, gd, gm))
    assert np.array_equal(got, ops.linear(q, e, w, mant, shift))
    assert np.array_equal(got, C.linear_w4(q.astype(np.int16), e.astype(np.int32), codes, gd, gm, mant, shift))


def test_rope(k):
    """q's heads and k's (another head count) rotated in one dispatch, each as the spec's rope."""
    rng = rng_for(7)
    T, nh, nkv, D, ctx = 4, 3, 2, 48, 40
    x = wide(rng, (T, nh, D), 31).clip(-(2**31 - 1), 2**31 - 1)
    xk = wide(rng, (T, nkv, D), 31).clip(-(2**31 - 1), 2**31 - 1)
    cos = rng.integers(-(2**14), 2**14 + 1, size=(ctx, D // 2)).astype(np.int16)
    sin = rng.integers(-(2**14), 2**14 + 1, size=(ctx, D // 2)).astype(np.int16)
    pos0 = 11
    got, got_k = G.rope(k, x, xk, cos, sin, pos0)
    for inp, out in ((x, got), (xk, got_k)):
        want = ops.rope(inp, cos[pos0:pos0 + T], sin[pos0:pos0 + T])
        assert np.array_equal(out, want)
        assert np.array_equal(out, C.rope(inp, cos[pos0:pos0 + T], sin[pos0:pos0 + T]))


def test_quant8_row(k):
    """K rows and V rows quantized into the cache in one dispatch, each as quant8_row."""
    rng = rng_for(8)
    x = wide(rng, (6, 2, 48), 31).clip(-(2**31 - 1), 2**31 - 1)
    x[0, 0] = 0
    x[1, 1, :] = 2**31 - 1
    xv = wide(rng, (6, 2, 48), 20)
    xv[2, 0] = 0
    for inp, (q, a) in zip((x, xv), G.quant8_rows(k, x, xv)):
        wq, wa = intmath.quant8_row(inp)
        assert np.array_equal(q, wq) and np.array_equal(a, wa)
        cq, ca = C.quant8_row(inp.reshape(-1, 48))
        assert np.array_equal(q.reshape(-1, 48), cq) and np.array_equal(a.ravel(), ca.ravel())


@pytest.mark.parametrize("window,T,P,softcapped", [(0, 1, 1, False), (0, 5, 37, False), (7, 4, 30, False),
                                                   (0, 2, 600, False), (0, 3, 20, True)])
def test_attention(k, window, T, P, softcapped):
    rng = rng_for(window, T, P)
    nh, nkv, D = 4, 2, 48
    q = rng.integers(-32767, 32768, size=(T, nh, D))
    e_q = rng.integers(0, 18, size=(T, nh))
    kc = rng.integers(-127, 128, size=(P, nkv, D))
    vc = rng.integers(-127, 128, size=(P, nkv, D))
    ka = rng.integers(0, 2**31 - 1, size=(P, nkv))
    va = rng.integers(0, 2**31 - 1, size=(P, nkv))
    pos = np.arange(P - T, P)
    sm, ss = 23456, 44
    cap = (98000, 1561246208, 37) if softcapped else None
    got = G.attention(k, q, e_q, kc, ka, vc, va, pos, sm, ss, window, cap)
    want = ops.attention(q, e_q, kc, ka, vc, va, pos, sm, ss, window, cap)
    assert np.array_equal(got, want)
    if window == 0 and not softcapped:  # the C++ op: one query row over every position
        c = C.attend(q[-1, 0].astype(np.int16), int(e_q[-1, 0]), kc[:, 0].astype(np.int8), ka[:, 0].astype(np.int32),
                     vc[:, 0].astype(np.int8), va[:, 0].astype(np.int32), sm, ss)
        assert np.array_equal(got[-1, 0], np.asarray(c).ravel())


def test_glu(k):
    rng = rng_for(9)
    g = wide(rng, 4000, 31).clip(-(2**31 - 1), 2**31 - 1)
    g[:5] = [0, 1, -1, 2**31 - 1, -(2**31 - 1)]
    u = wide(rng, 4000, 31).clip(-(2**31 - 1), 2**31 - 1)
    for kind, spec, cpp in ((0, ops.swiglu, C.swiglu), (1, ops.geglu, C.geglu)):
        got = G.glu(k, g, u, kind)
        assert np.array_equal(got, spec(g, u)), kind
        assert np.array_equal(got, cpp(g, u)), kind


def test_softcap(k):
    rng = rng_for(10)
    x = wide(rng, 3000, 31).clip(-(2**31 - 1), 2**31 - 1)
    for cap, mant, shift in ((786432, 1431655765, 29), (98000, 1561246208, 37), (1, 2**31 - 1, 62)):
        got = G.softcap(k, x, cap, mant, shift)
        assert np.array_equal(got, intmath.softcap(x, cap, mant, shift))
        assert np.array_equal(got, C.softcap(x, cap, mant, shift))


def test_argmax(k):
    rng = rng_for(11)
    z = rng.integers(-50, 50, size=(6, 321)).astype(np.int32)
    z[1] = 7  # all tied: index 0
    z[2, [5, 200]] = 1000  # a tie: the lower index
    assert np.array_equal(G.argmax(k, z), ops.argmax_lowest(z))


def test_embed(k):
    rng = rng_for(12)
    V, H = 50, 72
    q = rng.integers(-127, 128, size=(V, H)).astype(np.int8)
    mant = rng.integers(1, 2**15, size=V).astype(np.int32)
    shift = rng.integers(-8, 30, size=V).astype(np.int32)
    tokens = [3, 0, 49, 3]
    got = G.embed(k, tokens, q, mant, shift)
    t = np.asarray(tokens)
    assert np.array_equal(got, intmath.shift_round_sat32(q[t].astype(np.int64) * mant[t, None], shift[t, None]))


@pytest.mark.parametrize("top,norm_topk", [(1, True), (2, True), (3, False), (8, True)])
def test_moe_route(k, top, norm_topk):
    """The k largest router scores (ties: the lowest expert id) and their softmax weights."""
    rng = rng_for(top, norm_topk)
    z = rng.integers(-(2**20), 2**20, size=(7, 8))
    z[0] = 5  # all tied
    z[1, [2, 6]] = 2**21  # a tie for the top
    z[2] = rng.integers(-3, 3, size=8)  # several ties
    sel = np.argsort(-z, axis=1, kind="stable")[:, :top]
    if norm_topk:
        w = ops.softmax_q16(np.take_along_axis(z, sel, axis=1))
    else:
        w = np.take_along_axis(ops.softmax_q16(z), sel, axis=1)
    want = np.zeros_like(z)
    np.put_along_axis(want, sel, w, axis=1)
    assert np.array_equal(G.moe_route(k, z, top, norm_topk), want)


def test_linear_int8_coop_folds_past_grid_x(k):
    """Over GRID_X blocks of channels (a 262k vocabulary's lm_head) the coop entry folds them into y."""
    from intdet.webgpu.kernels import GRID_X, TPC, WG

    rng = rng_for(70)
    T, K, N = 1, 40, GRID_X * (WG // TPC) + 300
    q = rng.integers(-32767, 32768, size=(T, K))
    e = rng.integers(0, 20, size=T)
    w = rng.integers(-127, 128, size=(N, K)).astype(np.int8)
    mant = rng.integers(1, 2**15 + 1, size=N).astype(np.int32)
    shift = rng.integers(10, 50, size=N).astype(np.int32)
    assert np.array_equal(G.linear(k, q, e, w, mant, shift, coop=True), ops.linear(q, e, w, mant, shift))
