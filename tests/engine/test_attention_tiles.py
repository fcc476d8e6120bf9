"""Attention in tiles (csrc/model/attention.cpp, issue 20) against the integer
spec, all bits.

Op level (``_core.ops.attend_rows``: the forward's own attend_layer on a
filled cache) against ``ref/ops.py attention``: contexts 1, 63, 64, 65, 511
and 4,097 (across the 8-key, 128-position and tile-row boundaries), GQA
groups of 1 to 8 query heads, head sizes 32 to 256, sliding windows (with a
ring cache past window + 512), every kernel set this CPU runs (and the
AVX-512 set through the SIMDe build) at 1, 2 and 3 threads: both the
whole-tile path (many tiles) and the key-split path (few tiles: decode).
Model level: tiny random models' logits, prefill split anywhere and decode,
on every set and thread count against the scalar set at 1 thread, and a
Gemma 3 ring cache against the numpy spec (Engine 'ref')."""

import numpy as np
import pytest

from conftest import ISAS, THREADS, using_isa
from intdet import _core
from intdet.convert import convert
from intdet.model import Engine, load_model
from intdet.ref import ops as ref_ops
from intdet.ref.intmath import quant16

import models

I64 = np.int64


def make_case(seed, P, nh, nkv, D, T, extreme=False):
    """Random queries, int8 cache and scales; rows at the last T positions."""
    rng = np.random.default_rng(seed)
    top = 2**31 - 1 if extreme else 2**22
    q = rng.integers(-top, top + 1, (T, nh, D), dtype=I64)
    kc = rng.integers(-127, 128, (P, nkv, D), dtype=np.int8)
    vc = rng.integers(-127, 128, (P, nkv, D), dtype=np.int8)
    if extreme:  # all +-127: the largest int32 partial sums of q.k and P.V
        kc[::3] = np.where(kc[::3] >= 0, 127, -127)
        vc[:] = 127
    ka = rng.integers(0 if extreme else 1, 2**31 if extreme else 2**21, (P, nkv), dtype=np.int32)
    va = rng.integers(1, 2**31 if extreme else 2**21, (P, nkv), dtype=np.int32)
    pos = np.arange(P - T, P, dtype=I64)
    return q, kc, ka, vc, va, pos


def reference(q, kc, ka, vc, va, pos, mant, shift, window):
    qq, qe = quant16(q)
    return ref_ops.attention(qq, qe, kc.astype(I64), ka.astype(I64), vc.astype(I64), va.astype(I64), pos, mant, shift,
                             window)


# (nh, nkv, D): GQA groups 3 (SmolLM2's), 1, 2, 4 (Gemma 3 270M's 4:1 at D 256), 8.
SHAPES = [(3, 1, 48), (9, 3, 64), (4, 4, 32), (8, 4, 128), (4, 1, 256), (8, 1, 32)]
# (context P, rows T): boundaries of the 8-key blocks, 128-position P.V
# blocks and tiles; T = P for short contexts is a whole prefill.
CONTEXTS = [(1, 1), (63, 63), (64, 64), (65, 65), (511, 40), (4097, 3)]


def sets():
    """(module, isa) for every kernel set: this CPU's, and avx512 on SIMDe when built."""
    out = [(_core, i) for i in ISAS]
    try:
        from intdet import _core_simde

        if "avx512" not in ISAS:
            out.append((_core_simde, "avx512"))
    except ImportError:
        pass
    return out


def run_everywhere(args):
    """attend_rows on every set and thread count: {label: out}."""
    got = {}
    for mod, isa in sets():
        before = (mod.isa(), mod.thread_setting())
        try:
            mod.set_isa(isa)
            for th in THREADS:
                mod.set_num_threads(th)
                got[f"{mod.__name__}:{isa}:{th}t"] = mod.ops.attend_rows(*args)
        finally:
            mod.set_isa(before[0])
            mod.set_num_threads(before[1])
    return got


@pytest.mark.parametrize("P,T", CONTEXTS, ids=[f"ctx{p}" for p, _ in CONTEXTS])
@pytest.mark.parametrize("nh,nkv,D", SHAPES, ids=[f"{a}x{b}x{c}" for a, b, c in SHAPES])
@pytest.mark.simde  # sets(): the SIMDe avx512 set too, where it is built
def test_tiles_match_the_spec(P, T, nh, nkv, D):
    for k, window in enumerate([0, 5, 100] if P > 5 else [0]):
        case = make_case(1000 * P + 10 * D + k, P, nh, nkv, D, T)
        mant, shift = 23170, 47 - (D > 64)
        want = reference(*case, mant, shift, window)
        for label, out in run_everywhere((*case, mant, shift, window)).items():
            assert out.dtype == I64 and np.array_equal(out, want), (label, window)


@pytest.mark.parametrize("P,T,window", [(70, 70, 0), (1300, 9, 0), (1300, 9, 700), (700, 130, 3)])
@pytest.mark.simde
def test_extreme_values_match_the_spec(P, T, window):
    """Saturated scores, scales up to 2^31 - 1, all-127 values (the int32
    partial-sum bounds), a zero key scale, windows with and without a ring."""
    case = make_case(7 + P + window, P, 8, 2, 64, T, extreme=True)
    for mant, shift in [(32767, 30), (23170, 47), (1, 62)]:
        want = reference(*case, mant, shift, window)
        for label, out in run_everywhere((*case, mant, shift, window)).items():
            assert np.array_equal(out, want), (label, mant, shift)


def row_passes_spec(z, rr, va, e):
    """The softmax's row passes (attn_*_generic, ops.h) in numpy."""
    from intdet.ref.intmath import exp2_neg_q30, round_shift

    zmax = int(z.max())
    u = exp2_neg_q30(zmax - z)
    p = round_shift(u * I64(rr), 46) * va.astype(I64)
    w16 = np.clip(round_shift(p, e), -32767, 32767)
    return zmax, u, int(u.sum()), max(0, int(p.max())), w16


@pytest.mark.parametrize("n", [1, 3, 4, 7, 8, 9, 16, 17, 100, 1000])
@pytest.mark.simde
def test_row_passes_match_the_spec(n):
    """Every set's AttnRowFns on one row: short tails past the 4- and
    8-lane loops, scores at the int32 limits (u = 0 far below the max), rr
    at 2^32 (the vector split's high half) and past it (the scalar
    fallback), the exponent from the row's largest weight and others (the
    clamp to 32767), zero value scales."""
    rng = np.random.default_rng(n)
    for k in range(4):
        z = rng.integers(-(2**31) + 1, 2**31, n, dtype=I64) if k == 3 else rng.integers(-(2**20), 2**20, n, dtype=I64)
        va = rng.integers(0, 2**31, n, dtype=np.int32) if k else np.zeros(n, np.int32)
        va[:: 5] = 0
        u = row_passes_spec(z, 1, va, 0)[1]
        natural = (1 << 62) // int(u.sum())
        for rr in [natural, 2**32, 2**32 + 12345, 1]:
            pmax = row_passes_spec(z, rr, va, 0)[3]
            for e in sorted({max(int(pmax).bit_length() - 15, 0), 0, 7, 33, 40}):
                want = row_passes_spec(z, rr, va, e)
                for mod, isa in sets():
                    before = mod.isa()
                    try:
                        mod.set_isa(isa)
                        got = mod.ops.attn_row_passes(z, rr, va, e)
                    finally:
                        mod.set_isa(before)
                    label = (isa, k, rr, e)
                    assert got[0] == want[0] and got[2] == want[2] and got[3] == want[3], label
                    assert np.array_equal(got[1], want[1]) and np.array_equal(got[4], want[4]), label


def test_row_passes_refuse_bad_input():
    z, va = np.zeros(4, I64), np.ones(4, np.int32)
    for args, words in [((z, 0, va, 0), "rr must lie in"), ((z, 1, va, 41), "e must lie in"),
                        ((z, 1, -va, 0), "va must be >= 0"), ((z + 2**31, 1, va, 0), "z must lie in"),
                        ((z, 1, va[:3], 0), "va")]:
        with pytest.raises(ValueError, match=words):
            _core.ops.attn_row_passes(*args)


def test_rows_a_ring_no_longer_holds_are_refused():
    q, kc, ka, vc, va, _ = make_case(3, 800, 2, 1, 32, 2)
    pos = np.array([10, 799], I64)  # window 8 + 512 slots: once 799 is in, 10's keys are gone
    with pytest.raises(ValueError, match="attend_rows: attention reads positions the KV cache no longer holds"):
        _core.ops.attend_rows(q, kc, ka, vc, va, pos, 23170, 47, 8)


@pytest.mark.parametrize("bad,words", [
    (dict(q=np.zeros((1, 3, 32), I64)), "multiple of kv heads"),
    (dict(pos=np.array([5], I64)), "pos must lie in"),
    (dict(window=-1), "window must be >= 0"),
    (dict(va=-np.ones((4, 2), np.int32)), "va must be >= 0"),
])
def test_attend_rows_refusals(bad, words):
    q, kc, ka, vc, va, pos = make_case(4, 4, 2, 2, 32, 1)
    args = dict(q=q, kc=kc, ka=ka, vc=vc, va=va, pos=pos, score_mant=1, score_shift=40, window=0)
    args.update(bad)
    with pytest.raises(ValueError, match=words):
        _core.ops.attend_rows(*args.values())


# ------------------------------------------------------------- whole models

PROMPT_LEN = 600


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory):
    """A tiny Qwen3 with 8 query heads on 2 kv heads of 32 dims, one layer, context 1,024."""
    d = tmp_path_factory.mktemp("tiles")
    src = models.write_hf_model(str(d / "src"), "qwen3", num_hidden_layers=1, num_attention_heads=8,
                                num_key_value_heads=2, head_dim=32, max_position_embeddings=1024)
    return load_model(convert(src, str(d / "m"), progress=False))


def prompt(n, seed=0):
    return [int(t) for t in np.random.default_rng(seed).integers(3, 300, n)]


def run_split(lm, tokens, chunks, steps=4, max_len=1024):
    """Logits of every prompt position, prefilled in `chunks`, then `steps` greedy decode steps."""
    seq = Engine(lm, "cpu").new_state(max_len)
    outs, i = [], 0
    for c in chunks:
        outs.append(seq.forward(tokens[i:i + c], all_logits=True))
        i += c
    for _ in range(steps):
        outs.append(seq.forward([int(np.argmax(outs[-1].reshape(-1, outs[-1].shape[-1])[-1]))]))
    return np.concatenate([o.reshape(-1, o.shape[-1]) for o in outs])


@pytest.fixture(scope="module")
def want(gqa_model):
    with using_isa("scalar", 1):
        return run_split(gqa_model, prompt(PROMPT_LEN), [PROMPT_LEN])


def test_model_every_isa_and_thread_count(gqa_model, want, isa_threads):
    assert np.array_equal(run_split(gqa_model, prompt(PROMPT_LEN), [PROMPT_LEN]), want), isa_threads


@pytest.mark.parametrize("chunks", [[1, 62, 1, 1, 535], [64, 65, 471], [511, 89], [599, 1], [33] * 18 + [6]])
def test_model_prefill_split_anywhere(gqa_model, want, chunks):
    assert sum(chunks) == PROMPT_LEN
    with using_isa(ISAS[-1], 2):
        assert np.array_equal(run_split(gqa_model, prompt(PROMPT_LEN), chunks), want), chunks


def test_gemma3_ring_cache_matches_the_spec(tmp_path):
    """Gemma 3's local layers (window 5) keep a ring of 517 positions: a
    prompt of 700 (split by the forward into calls of at most 512 rows) and
    decode past it, against the numpy spec, which keeps every position."""
    src = models.write_hf_model(str(tmp_path / "src"), "gemma3", max_position_embeddings=1024)
    lm = load_model(convert(src, str(tmp_path / "m"), progress=False))
    toks = prompt(700, seed=1)
    want = []
    ref = Engine(lm, "ref").new_state(760)
    want.append(ref.forward(toks, all_logits=True))
    got = []
    seq = Engine(lm, "cpu").new_state(760)
    got.append(seq.forward(toks, all_logits=True))
    for step in range(4):
        tok = [(37 * step + 11) % 300]
        want.append(ref.forward(tok))
        got.append(seq.forward(tok))
    V = lm.cfg["vocab_size"]
    assert np.array_equal(np.concatenate([g.reshape(-1, V) for g in got]),
                          np.concatenate([w.reshape(-1, V) for w in want]))


@pytest.mark.parametrize("nh,nkv,T", [(1, 1, 1), (1, 1, 2), (2, 2, 1), (3, 1, 1)])
@pytest.mark.parametrize("window", [0, 1200])
@pytest.mark.simde
def test_key_split_path_matches_the_spec(nh, nkv, T, window):
    """Decode rows with fewer tiles and head parts than threads at a long
    context: attend_layer splits each tile's keys across threads (one head
    and one KV head at 2 or 3 threads; two single-head tiles at 3 threads;
    three heads, one KV head, one row at 3+ threads splits only heads)."""
    P = 1500
    case = make_case(P + 31 * nh + T + window, P, nh, nkv, 64, T)
    want = reference(*case, 23170, 47, window)
    for label, out in run_everywhere((*case, 23170, 47, window)).items():
        assert np.array_equal(out, want), label
