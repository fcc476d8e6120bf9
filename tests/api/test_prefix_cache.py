"""Exact prefix caching (prefix_cache.py, State.copy_prefix): a request
that reuses a retired request's KV gives every token, text, log-probability
and chain hash of a cold run, under concurrency, eviction and speculative
decoding; the reuse really happens (else these tests could not fail)."""

import numpy as np
import pytest
from test_scheduler import engine, got, make  # noqa: F401  (fixture)

from intdet.errors import IntdetError
from intdet.prefix_cache import PrefixCache
from intdet.scheduler import Scheduler, kv_bytes_per_position


def fewshot(n=8, seed=5):
    """Prompts sharing a 60-token prefix (a few-shot header), each with its
    own tail; greedy and sampled, some with log-probabilities."""
    rng = np.random.default_rng(seed)
    head = [int(t) for t in rng.integers(3, 300, 60)]
    out = []
    for i in range(n):
        tail = [int(t) for t in rng.integers(3, 300, int(rng.integers(1, 12)))]
        sampler = {} if i % 2 == 0 else dict(temperature="0.8", seed=int(rng.integers(0, 2**63)), top_k=20)
        out.append(dict(prompt=head + tail, max_new=int(rng.integers(4, 20)), sampler=sampler,
                        logprobs=None if i % 3 else 2, prompt_logprobs=None, score_from=None))
    return out


def run(engine, ss, **kw):
    sch = Scheduler(engine, **{"kv_bytes": 1 << 40, **kw})
    ev = [[] for _ in ss]
    reqs = []
    for i, s in enumerate(ss):
        reqs.append(sch.submit(make(engine, s, on_event=ev[i].append)))
        if kw.get("max_batch") == 1:
            sch.run_until_idle()  # one after another: each later one can hit
    sch.run_until_idle()
    return sch, reqs, ev


@pytest.mark.parametrize("kw", [dict(max_batch=1), dict(max_batch=1, spec_tokens=4),
                                dict(max_batch=1, step_tokens=7)])
def test_hits_equal_cold_runs(engine, kw):  # noqa: F811
    ss = fewshot()
    _, cold, ev0 = run(engine, ss, max_batch=1)
    sch, warm, ev1 = run(engine, ss, prefix_cache=True, **kw)
    for a, b, ea, eb in zip(cold, warm, ev0, ev1):
        assert got(b, eb) == got(a, ea) and b.hashes == a.hashes
    assert warm[0].cached_tokens == 0 and all(r.cached_tokens >= 60 for r in warm[1:])
    assert sch.cache.hits == len(ss) - 1 and sch.cache.hit_tokens == sum(r.cached_tokens for r in warm)


def test_concurrent_requests_and_eviction(engine):  # noqa: F811
    """Many requests at once with a KV budget of a few sequences: cached
    prefixes are evicted for new requests, hits still equal cold runs."""
    ss = fewshot(16, seed=9)
    _, cold, ev0 = run(engine, ss, max_batch=1)
    per = kv_bytes_per_position(engine.lm.cfg)
    sch, warm, ev1 = run(engine, ss, prefix_cache=True, max_batch=3, kv_bytes=per * 300)
    for a, b, ea, eb in zip(cold, warm, ev0, ev1):
        assert got(b, eb) == got(a, ea)
    assert sch.cache.hits > 0 and sch.cache.bytes + sch.kv_used <= per * 300
    assert len(sch.cache) >= 1


def test_requests_needing_prompt_logits_do_not_hit(engine):  # noqa: F811
    ss = fewshot(3)
    ss[2]["prompt_logprobs"] = 1
    sch, warm, _ = run(engine, ss, prefix_cache=True, max_batch=1)
    assert warm[1].cached_tokens > 0 and warm[2].cached_tokens == 0
    assert len(warm[2].prompt_token_logprobs) == len(ss[2]["prompt"])


def test_copy_prefix_bits_and_bounds(engine):  # noqa: F811
    ids = list(range(20, 60))
    a = engine.new_state(64)
    a.forward(ids)
    b = engine.new_state(50)
    b.copy_prefix(a, 30)
    assert b.n_past == 30
    cold = engine.new_state(64)
    want = cold.forward(ids[:35], all_logits=True)[30:]
    assert np.array_equal(b.forward(ids[30:35], all_logits=True), want)
    with pytest.raises(IntdetError, match="needs an empty sequence"):
        b.copy_prefix(a, 3)
    c = engine.new_state(16)
    with pytest.raises(IntdetError, match=r"copy_prefix: 20 is outside \[0, 16\]"):
        c.copy_prefix(a, 20)
    ref = engine.__class__(engine.lm, "ref")
    ra, rb = ref.new_state(64), ref.new_state(64)
    ra.forward(ids[:12])
    rb.copy_prefix(ra, 10)
    assert np.array_equal(rb.forward(ids[10:12], all_logits=True),
                          ref.new_state(64).forward(ids[:12], all_logits=True)[10:])


def test_prefix_cache_lru_and_cover():
    pc = PrefixCache(min_tokens=2)

    class S:
        pass

    assert pc.insert([1, 2, 3], S(), 10) and not pc.insert([1, 2], S(), 10)  # covered
    assert pc.insert([1, 2, 3, 4], S(), 10) and len(pc) == 1 and pc.bytes == 10  # extends: replaces
    assert pc.insert([7, 8, 9], S(), 5) and pc.bytes == 15
    e, m = pc.lookup([1, 2, 3, 4, 5])
    assert m == 4 and list(e.ids) == [1, 2, 3, 4]
    e, m = pc.lookup([1, 2, 3, 4])  # the last prompt token is always computed
    assert m == 3
    assert pc.lookup([5, 6, 7])[0] is None and pc.lookup([7])[0] is None
    assert pc.evict_oldest() == 5 and len(pc) == 1  # [7, 8, 9] was used least recently
    assert (pc.lookups, pc.hits, pc.hit_tokens) == (4, 2, 7)


def test_requests_admitted_together_share_the_first_prompt(engine):  # noqa: F811
    """Eight few-shot requests admitted in one step: prompts are prefilled in
    admission order, so each later one copies the header from the first
    (a live entry) and computes only its own tail; bits as cold runs."""
    ss = fewshot(8, seed=3)
    _, cold, ev0 = run(engine, ss, max_batch=1)
    sch, warm, ev1 = run(engine, ss, prefix_cache=True, max_batch=8, step_tokens=64)
    for a, b, ea, eb in zip(cold, warm, ev0, ev1):
        assert got(b, eb) == got(a, ea)
    assert warm[0].cached_tokens == 0 and all(r.cached_tokens >= 60 for r in warm[1:]), [r.cached_tokens for r in warm]
    assert not any(e.live for e in sch.cache.entries.values())  # every request retired: no live entry left


def test_a_hit_does_not_wait_behind_a_long_prompt(engine):  # noqa: F811
    """Shortest remaining prompt first: a hit's last few prompt tokens run in
    the first step after admission although a long prompt (a miss) was
    admitted before it; both give their cold runs' bits; a prompt passed
    over PREFILL_PATIENCE times goes first (no starvation)."""
    from intdet.scheduler import PREFILL_PATIENCE, Request

    rng = np.random.default_rng(9)
    head = [int(t) for t in rng.integers(3, 300, 40)]
    long_prompt = [int(t) for t in rng.integers(3, 300, 200)]
    sch = Scheduler(engine, max_batch=4, step_tokens=32, kv_bytes=1 << 40, prefix_cache=True)
    sch.submit(Request(head + [7], 2))
    sch.run_until_idle()  # head + [7] is cached now
    miss = sch.submit(Request(long_prompt, 3))
    hit = sch.submit(Request(head + [9], 3))
    steps = 0
    while not hit.tokens:
        sch.step()
        steps += 1
    assert steps == 1 and hit.cached_tokens == 40 and miss._prefilled < len(long_prompt)
    sch.run_until_idle()
    for r in (miss, hit):
        cold_s = Scheduler(engine, kv_bytes=1 << 40)
        cold = cold_s.submit(Request(r.prompt_ids, 3))
        cold_s.run_until_idle()
        assert (r.tokens, r.hash) == (cold.tokens, cold.hash)
    # starvation: short prompts every step would pass the long one over; it goes first after PREFILL_PATIENCE
    sch = Scheduler(engine, max_batch=64, step_tokens=8, kv_bytes=1 << 40)
    starved = sch.submit(Request(long_prompt[:100], 1))
    first = None
    for i in range(40):
        sch.submit(Request([int(t) for t in rng.integers(3, 300, 8)], 1))
        sch.step()
        if first is None and starved._prefilled:
            first = i
    assert first is not None and first <= PREFILL_PATIENCE + 1


def test_prefix_cache_on_the_cuda_emulator(engine, monkeypatch):  # noqa: F811
    """State.copy_prefix on the CUDA module (host emulator): the copied
    KV continues as a cold prefill would (all logits' bits), the scheduler's
    hits equal CPU cold runs, and a state of another model is refused."""
    from intdet.model import Engine
    from test_cuda import _emu_or_skip

    monkeypatch.setattr("intdet.backends.cuda.cuda_module", lambda: _emu_or_skip())
    emu = Engine(engine.lm, "cuda")
    ids = list(range(20, 60))
    a = emu.new_state(64)
    a.forward(ids)
    b = emu.new_state(50)
    assert b.can_copy_prefix
    b.copy_prefix(a, 30)
    want = engine.new_state(64).forward(ids[:35], all_logits=True)[30:]
    assert np.array_equal(b.forward(ids[30:35], all_logits=True), want)
    with pytest.raises(ValueError, match="different models"):
        Engine(engine.lm, "cuda").new_state(8)._state.copy_prefix(a._state, 3)
    ss = fewshot(5)
    _, cold, ev0 = run(engine, ss, max_batch=1)
    sch, warm, ev1 = run(emu, ss, prefix_cache=True, max_batch=1)
    for x, y, ex, ey in zip(cold, warm, ev0, ev1):
        assert got(y, ey) == got(x, ex)
    assert sch.cache.hits == len(ss) - 1


def test_on_by_default_in_the_api(engine):  # noqa: F811
    """LLM() keeps a prefix cache unless prefix_cache=False: the second of
    two prompts sharing a header reuses the first's KV, and both give the
    tokens and hashes of the LLM without the cache."""
    import intdet

    prompts = [s["prompt"] for s in fewshot(2)]
    on, off = intdet.LLM(engine.lm), intdet.LLM(engine.lm, prefix_cache=False)
    assert on.scheduler.cache is not None and off.scheduler.cache is None
    sp = intdet.SamplingParams(max_tokens=8, temperature="0.8", seed=7)
    warm, cold = [on.generate(p, sp) for p in prompts], [off.generate(p, sp) for p in prompts]
    assert [(c.tokens, c.hash) for c in warm] == [(c.tokens, c.hash) for c in cold]
    assert warm[1].cached_tokens >= 60 and cold[1].cached_tokens == 0
