"""The few-shot workload of scripts/bench_prefix.py and bench_serve.py: the
prompts share one header except every k-th, which has its own (a prefix
cache miss under load)."""

import os

import pytest
from conftest import load_script


def test_fresh_headers_every_kth():
    bp = load_script("bench_prefix")
    if not os.path.exists(bp.WIKI):
        pytest.skip("no WikiText-2 test split at ../shared/data")
    plain = bp.prompts(lambda t: t, 5, 16)
    mixed = bp.prompts(lambda t: t, 5, 16, fresh_every=8)
    head = plain[0][:plain[0].rindex("Passage:")]
    assert all(p.startswith(head) for p in plain)
    for i, p in enumerate(mixed):
        if i % 8 == 7:
            assert p != plain[i] and p[:50] != head[:50] and p.endswith(plain[i][len(head):])
        else:
            assert p == plain[i]
    assert mixed[7][:mixed[7].rindex("Passage:")] != mixed[15][:mixed[15].rindex("Passage:")]
