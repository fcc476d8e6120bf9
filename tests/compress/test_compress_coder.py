"""intdet compress: the range coder, the Python spec against the C++ twin
byte for byte, round trips, and the row drivers (same bytes at any thread
count)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intdet import _core
from intdet.compress.rangecoder import CorruptStream, RangeDecoder, RangeEncoder
from intdet.compress.table import freq_table

C = _core.compress


def code_both(syms, tables, p):
    """syms [n], tables [n, V]: the spec's and the core's bytes (must agree)."""
    ref, cpp = RangeEncoder(), C.RangeEncoder()
    cum = np.concatenate([np.zeros((len(tables), 1), np.int64), np.cumsum(tables, axis=1)], axis=1)
    for s, t, c in zip(syms, tables, cum):
        ref.encode(int(c[s]), int(t[s]), p)
        cpp.encode(int(c[s]), int(t[s]), p)
    a, b = ref.finish(), cpp.finish()
    assert a == b
    return a


def decode_spec(data, tables, p):
    d = RangeDecoder(data)
    return [d.decode(t, p) for t in tables]


def random_tables(rng, n, V, p, skew):
    z = (rng.standard_normal((n, V)) * skew * 65536).astype(np.int32)
    return freq_table(z, p), z


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 300), st.integers(1, 300), st.sampled_from([24, 28, 30]),
       st.sampled_from([0.0, 1.0, 4.0, 30.0]), st.booleans())
def test_spec_matches_core_and_round_trips(seed, n, V, p, skew, likely):
    rng = np.random.default_rng(seed)
    tables, _ = random_tables(rng, n, V, p, skew)
    # symbols drawn from the tables (typical text) or uniformly (the rare ones)
    syms = [int(np.argmax(t)) if likely and rng.random() < 0.7 else int(rng.integers(V)) for t in tables]
    data = code_both(syms, tables, p)
    assert decode_spec(data, tables, p) == syms


def test_extremes():
    p, V = 28, 1000
    t = np.ones(V, np.int64)
    t[0] = (1 << p) - (V - 1)
    # the least likely symbol 500 times: ~28 bits each, long carry chains
    data = code_both([V - 1] * 500, np.tile(t, (500, 1)), p)
    assert 500 * 28 / 8 - 2 <= len(data) <= 500 * 28 / 8 + 8
    assert decode_spec(data, np.tile(t, (500, 1)), p) == [V - 1] * 500
    # the most likely symbol: almost nothing
    data = code_both([0] * 10000, np.tile(t, (10000, 1)), p)
    assert len(data) <= 3
    assert decode_spec(data, np.tile(t, (10000, 1)), p) == [0] * 10000
    # nothing at all
    assert code_both([], np.zeros((0, V), np.int64), p) == b""


def test_rows_drivers_any_thread_count():
    rng = np.random.default_rng(5)
    p, T, V = 28, 200, 777
    _, z = random_tables(rng, T, V, p, 6.0)
    tgt = rng.integers(0, V, size=T).astype(np.int32)
    tgt[::3] = np.argmax(z[::3], axis=1)
    outs = set()
    n0 = _core.num_threads()
    try:
        for threads in (1, 2, 3):
            _core.set_num_threads(threads)
            e = C.RangeEncoder()
            e.encode_rows(z[:50], tgt[:50], p)
            e.encode_rows(z[50:], tgt[50:], p)
            outs.add(e.finish())
            # batched decoding: one decoder per row of a batch of 4 copies
            data = next(iter(outs))
            decs = [C.RangeDecoder(data) for _ in range(4)]
            got = [C.decode_rows(decs, [z[t]] * 4, p) for t in range(T)]
            assert all((g == tgt[t]).all() for t, g in enumerate(got))
    finally:
        _core.set_num_threads(n0)
    assert len(outs) == 1
    spec = code_both(tgt, freq_table(z, p), p)
    assert outs == {spec}


def test_corrupt_streams_are_caught():
    """Bytes no encoder writes (a code value past the last slot) are reported
    by both decoders; random bytes decode to valid ids without reading out of
    bounds (the container's checksums catch those)."""
    p, V = 28, 50
    t = np.ones(V, np.int64)
    t[0] = (1 << p) - (V - 1)
    with pytest.raises(CorruptStream):
        RangeDecoder(b"\xff" * 6).decode(t, p)
    z = np.zeros(V, np.int32)
    assert C.decode_rows([C.RangeDecoder(b"\xff" * 6)], [z], p)[0] == -1
    rng = np.random.default_rng(9)
    for _ in range(30):
        data = rng.bytes(int(rng.integers(0, 20)))
        d, cd = RangeDecoder(data), C.RangeDecoder(data)
        zt = freq_table(z, p)
        for _ in range(10):
            try:
                s = d.decode(zt, p)
            except CorruptStream:
                assert C.decode_rows([cd], [z], p)[0] == -1
                break
            assert C.decode_rows([cd], [z], p)[0] == s


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 1200), st.sampled_from([24, 28, 30]),
       st.sampled_from([0.0, 2.0, 8.0, 40.0]))
def test_slot_drivers_match_spec_at_block_edges(seed, V, p, skew):
    """encode_rows / decode_rows find a symbol's slot from block sums of 256
    ids (freq_table.h SlotTable) without the whole table: same bytes as the
    spec coder on table.py's tables, for vocabularies below, at and across
    block edges, targets on the argmax, next to it and at block edges."""
    rng = np.random.default_rng(seed)
    T = 24
    tables, z = random_tables(rng, T, V, p, skew)
    arg = np.argmax(z, axis=1)
    picks = [arg, np.minimum(arg + 1, V - 1), np.maximum(arg - 1, 0), np.full(T, min(255, V - 1)),
             np.full(T, min(256, V - 1)), np.full(T, V - 1), np.zeros(T, np.int64), rng.integers(0, V, T)]
    tgt = np.array([picks[t % len(picks)][t] for t in range(T)], np.int32)
    e = C.RangeEncoder()
    e.encode_rows(np.ascontiguousarray(z), tgt, p)
    data = e.finish()
    assert data == code_both(tgt, tables, p)
    dec = C.RangeDecoder(data)
    assert [int(C.decode_rows([dec], [z[t]], p)[0]) for t in range(T)] == tgt.tolist()
