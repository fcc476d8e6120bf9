"""Batch invariance: a sequence's logits are the same bits alone and inside
batches (mixed prefill and batched decode) with co-sequences of other lengths."""

import numpy as np
import pytest

from intdet.convert import convert
from intdet.model import Engine, load_model


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny_llama_hf):
    return Engine(load_model(convert(tiny_llama_hf, str(tmp_path_factory.mktemp("b") / "m"), progress=False)))


@pytest.mark.parametrize("batch", [1, 2, 4, 8, 32])
def test_batch_invariance(engine, batch):
    rng = np.random.default_rng(batch)
    target = [5, 17, 99, 230, 41, 7, 300]
    steps = [9, 33, 101, 4, 250]
    alone = engine.new_state(64)
    want = [alone.forward(target, all_logits=True)] + [alone.forward([t]) for t in steps]
    co = [list(rng.integers(0, 320, size=int(rng.integers(1, 30)))) for _ in range(batch - 1)]
    seqs = [engine.new_state(64) for _ in range(batch)]
    order = rng.permutation(batch)  # the target sits anywhere in the batch
    prompts = [target] + co
    outs = engine.forward_batch([seqs[i] for i in order], [prompts[i] for i in order], all_logits=True)
    got = [outs[list(order).index(0)]]
    for t in steps:
        toks = [[t] if i == 0 else [int(rng.integers(0, 320))] for i in order]
        outs = engine.forward_batch([seqs[i] for i in order], toks)
        got.append(outs[list(order).index(0)])
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


def test_per_sequence_all_logits(engine):
    """all_logits as one flag per sequence: each sequence gets every row or
    only its last, the same bits as alone; the arrays are views of one
    buffer that stay valid after the call; a wrong flag count is an error."""
    prompts = [[5, 17, 99], [230, 41], [7, 300, 9, 33]]
    flags = [True, False, True]
    want = [engine.new_state(16).forward(p, all_logits=f) for p, f in zip(prompts, flags)]
    seqs = [engine.new_state(16) for _ in prompts]
    outs = engine.forward_batch(seqs, prompts, all_logits=flags)
    assert [o.shape[0] for o in outs] == [3, 1, 4]
    for g, w in zip(outs, want):
        assert g.dtype == np.int32 and np.array_equal(g, w)
    with pytest.raises(Exception, match="all_logits"):
        engine.forward_batch([engine.new_state(16)] * 1, [[1]], all_logits=[True, False])
