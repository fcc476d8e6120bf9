"""Each WebGPU kernel run alone on numpy inputs, in the spec op's terms
(python/intdet/ref/ops.py), for the op-level tests."""

from __future__ import annotations

import numpy as np

from intdet.webgpu import pack
from intdet.webgpu.kernels import groups_coop, groups_flat, groups_rows, run_one


def quant16(k, x):
    """ops.quant16 of rows x (int64 [rows, n]): (q [rows, n], e [rows])."""
    x = np.asarray(x, np.int64)
    rows, n = x.shape
    kw = pack.words(n)
    fits = np.abs(x).max() < 2**31
    name = "quant16_i32" if fits else "quant16_i64"
    xin = x.astype(np.int32) if fits else pack.i64_pairs(x)
    act = np.zeros((rows, 2 * kw), np.uint32)
    e = np.zeros(rows, np.int32)
    _, act, e = run_one(k, name, [xin, act, e], [n, rows, kw, 0, 0], groups_rows(rows))
    return pack.unpack_i16_act(act, n), e.astype(np.int64)


def rms_norm(k, x, g, eps, in_frac):
    x = np.asarray(x, np.int32)
    rows, n = x.shape
    out = np.zeros_like(x)
    p = [n, rows, in_frac, int(eps) & 0xFFFFFFFF, int(eps) >> 32, 0, 0, 0, 0]
    p = [v - (1 << 32) if v >= 1 << 31 else v for v in p]
    return run_one(k, "rms_norm", [x, np.asarray(g, np.int32), out], p, groups_rows(rows))[2].astype(np.int64)


def rms_norm_quant16(k, x, g, eps, in_frac, in0=0, out0=0):
    """rms_norm of rows x[in0:] then quant16 of each normed row, one dispatch: (y, q, e), rows out0.. of
    the outputs."""
    x = np.asarray(x, np.int32)
    rows, n = x.shape
    rows -= in0
    kw = pack.words(n)
    out = np.zeros((out0 + rows, n), np.int32)
    act = np.zeros((out0 + rows, 2 * kw), np.uint32)
    e = np.zeros(out0 + rows, np.int32)
    p = [n, rows, in_frac, int(eps) & 0xFFFFFFFF, int(eps) >> 32, 0, 0, in0, out0, kw]
    p = [v - (1 << 32) if v >= 1 << 31 else v for v in p]
    res = run_one(k, "rms_norm_quant16", [x, np.asarray(g, np.int32), out, act, e], p, groups_rows(rows))
    return res[2][out0:].astype(np.int64), pack.unpack_i16_act(res[3], n)[out0:], res[4][out0:].astype(np.int64)


def linear(k, q, e, w, mant, shift, bias=None, w4=None, coop=False):
    """ops.linear (int8 w [N, K]; or int4 w4 = (codes, gd, gm)); coop: linear8's coop entry."""
    q = np.asarray(q, np.int64)
    T, K = q.shape
    act = pack.pack_i16_act(q)
    ex = np.asarray(e, np.int32)
    N = len(mant)
    out = np.zeros((T, N), np.int32)
    b = np.zeros(N, np.int32) if bias is None else np.asarray(bias, np.int32)
    p = [N, 0, T, 0, int(bias is not None), 0, 0]
    if w4 is None:
        w = np.asarray(w, np.int8)
        chan = np.stack([w.astype(np.int64).sum(1), mant, shift, b]).astype(np.int32)
        p[1] = pack.words(K)
        return run_one(k, "linear8_coop" if coop else "linear8",
                       [act, ex, pack.pack_i8_rows(w), chan, out, np.zeros(1, np.int32)], p + [0, 0, -1],
                       groups_coop(N, T) if coop else (-(-N // 64), T, 1))[4].astype(np.int64)
    codes, gd, gm = w4
    grp = np.stack([np.asarray(gd, np.int32), np.asarray(gm, np.int32)], axis=-1)
    chan = np.stack([mant, shift, b]).astype(np.int32)
    p[1] = K // 32
    return run_one(k, "linear4", [act, ex, pack.pack_int4(codes), grp, chan, out, np.zeros(1, np.int32)], p + [0, 0, -1],
                   (-(-N // 64), T, 1))[5].astype(np.int64)


def linear_segments(k, q, e, parts, coop=False):
    """Two or three int8 linears of one input (parts: (w [N_i, K], mant, shift, bias or None)) in
    one dispatch of linear8 ``segments``: each one's [T, N_i] output."""
    q = np.asarray(q, np.int64)
    T, K = q.shape
    Ns = [len(m) for _, m, _, _ in parts] + [0] * (3 - len(parts))
    chan = np.concatenate([np.stack([np.asarray(w, np.int64).sum(1), m, s, np.zeros(len(m)) if b is None else b])
                           for w, m, s, b in parts], axis=1).astype(np.int32)
    w = pack.pack_i8_rows(np.concatenate([np.asarray(w, np.int8) for w, _, _, _ in parts]))
    outs = [np.zeros((T, max(n, 1)), np.int32) for n in Ns]
    p = [sum(Ns), pack.words(K), T, 0, int(any(b is not None for *_, b in parts)), 0, 0, 0, 0, -1, 0, Ns[0], Ns[1]]
    res = run_one(k, "linear8_segments_coop" if coop else "linear8_segments",
                  [pack.pack_i16_act(q), np.asarray(e, np.int32), w, chan, outs[0], np.zeros(1, np.int32), outs[1],
                   outs[2]], p, groups_coop(sum(Ns), T) if coop else (-(-sum(Ns) // 64), T, 1))
    return [res[i].astype(np.int64) for i in (4, 6, 7)][:len(parts)]


def rope(k, x, xk, cos, sin, pos0=0):
    """ops.rope of q x [T, nh, D] and k xk [T, nkv, D] at positions pos0.. in one dispatch (cos,
    sin: the whole [ctx, D/2] tables): (q, k) rotated."""
    x, xk = np.asarray(x, np.int32), np.asarray(xk, np.int32)
    T, nh, D = x.shape
    nkv = xk.shape[1]
    g = groups_flat((nh + nkv) * D // 2)
    res = run_one(k, "rope", [x.copy(), np.asarray(cos, np.int32), np.asarray(sin, np.int32), xk.copy()],
                  [T, nh, D, pos0, 0, nkv], (g[0], T, 1))
    return res[0].astype(np.int64).reshape(x.shape), res[3].astype(np.int64).reshape(xk.shape)


def quant8_rows(k, xk, xv):
    """ops.quant8_row of K rows xk and V rows xv [T, nkv, D], stored at
    positions 0..T-1 of a fresh cache in one dispatch: ((qk, ak), (qv, av)),
    q [T, nkv, D], a [T, nkv]."""
    xk, xv = np.asarray(xk, np.int32), np.asarray(xv, np.int32)
    T, nkv, D = xk.shape
    dw = pack.words(D)
    kv = np.zeros((2, T, nkv, dw), np.uint32)
    sc = np.zeros((2, T, nkv), np.int32)
    _, kv, sc, _ = run_one(k, "kv_store", [xk.reshape(T, nkv * D), kv, sc, xv.reshape(T, nkv * D)],
                           [D, dw, nkv, T, 0, 0, T * nkv], groups_rows(2 * T * nkv))
    return [(pack.unpack_i8_rows(kv[w], D), sc[w].astype(np.int64)) for w in (0, 1)]


def attention(k, q, e_q, kc, ka, vc, va, pos, score_mant, score_shift, window=0, score_softcap=None):
    """ops.attention with the cache as its arrays (positions 0..P-1); pos: consecutive query positions."""
    T, nh, D = q.shape
    P, nkv, _ = kc.shape
    dw = pack.words(D)
    qa = pack.pack_i16_act(np.asarray(q).reshape(T * nh, D))
    kv = np.stack([pack.pack_i8_rows(kc), pack.pack_i8_rows(vc)])
    sc = np.stack([ka, va]).astype(np.int32)
    S = int(pos[-1]) + 1
    scr = np.zeros(T * nh * S, np.int32)
    out = np.zeros((T * nh * D, 2), np.uint32)
    cap = score_softcap or (0, 0, 0)
    p = [nh, nkv, D, dw, P, int(pos[0]), window, score_mant, score_shift, int(score_softcap is not None), *cap,
         T * nh, S]
    res = run_one(k, "attention", [qa, np.asarray(e_q, np.int32).reshape(-1), kv, sc, scr, out], p,
                  groups_rows(T * nh))
    return pack.from_pairs(res[5]).reshape(T, nh, D)


def glu(k, g, u, kind):
    g = np.asarray(g, np.int32).ravel()
    out = np.zeros((g.size, 2), np.uint32)
    res = run_one(k, "glu", [g, np.asarray(u, np.int32).ravel(), out], [g.size, kind], groups_flat(g.size))
    return pack.from_pairs(res[2])


def softcap(k, x, cap, mant, shift):
    x = np.asarray(x, np.int32).ravel()
    return run_one(k, "softcap", [x], [x.size, cap, mant, shift, 0], groups_flat(x.size))[0].astype(np.int64)


def argmax(k, z):
    z = np.asarray(z, np.int32)
    rows, V = z.shape
    return run_one(k, "argmax", [z, np.zeros(rows, np.int32)], [V, rows], groups_rows(rows))[1].astype(np.int64)


def embed(k, tokens, q, mant, shift):
    """The forward's embedding rows: shift_round_sat32(q[tok] * mant[tok], shift[tok])."""
    V, H = q.shape
    T = len(tokens)
    x = np.zeros((T, H), np.int32)
    g = groups_flat(H)
    res = run_one(k, "embed", [np.asarray(tokens, np.int32), pack.pack_i8_rows(q),
                               np.stack([mant, shift]).astype(np.int32), x], [H, pack.words(H), T, 0, V], (g[0], T, 1))
    return res[3].astype(np.int64)


def moe_route(k, z, top, norm_topk):
    """The router's choice (ref model.py _moe) as [T, E] weights, 0 for the experts not chosen."""
    z = np.asarray(z, np.int32)
    T, E = z.shape
    w = np.zeros_like(z)
    res = run_one(k, "moe_route", [z, w, np.zeros(4, np.int32), np.zeros(4, np.uint32)], [T, E, top, int(norm_topk)],
                  groups_flat(T))
    return res[1].astype(np.int64)
