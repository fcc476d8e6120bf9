"""The scheduler's promise: whatever the arrival order, concurrency, token
budget (prefill chunking) and KV memory, each request's tokens, text,
log-probabilities and chain hash (which covers every step's int32 logits)
equal those of the same request run alone with the plain reference loop
(tests/oracle.py)."""

import threading
import time

import numpy as np
import pytest

from intdet.convert import convert
from intdet.errors import IntdetError
from intdet.generate import TextStream
from oracle import generate
from intdet.logprobs import LogSoftmax
from intdet.model import Engine, load_model
from intdet.sampling import Sampler
from intdet.scheduler import Request, Scheduler, kv_bytes_per_position


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny_llama_hf):
    return Engine(load_model(convert(tiny_llama_hf, str(tmp_path_factory.mktemp("s") / "m"), progress=False)))


def specs(seed=0, n=14):
    """Mixed requests: greedy and sampled (temperature, top-k/p, min-p,
    repetition penalty), prompts of 1 to 150 ids, 0 to 40 new tokens,
    log-probabilities, prompt log-probabilities, a scored continuation."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        plen = int(rng.choice([1, 3, 9, 40, 150]))
        kind = i % 4
        s = dict(prompt=[int(t) for t in rng.integers(3, 320, plen)], max_new=int(rng.choice([0, 1, 5, 17, 40])),
                 sampler=dict() if kind == 0 else dict(temperature="0.9", seed=int(rng.integers(0, 2**63)),
                                                        top_k=int(rng.choice([0, 20])), top_p="0.95",
                                                        min_p="0.05" if kind == 2 else "0",
                                                        repeat_penalty="1.3" if kind == 3 else "1"),
                 logprobs=None if i % 3 else 3, prompt_logprobs=2 if i % 5 == 1 else None,
                 score_from=None)
        if i % 7 == 3 and plen > 3:
            s["score_from"], s["prompt_logprobs"] = plen - 2, 0
        out.append(s)
    return out


def alone(engine, s, stop=()):
    """The request run by itself through the reference loop (tests/oracle.py), plus its
    log-probabilities from one whole forward of prompt + tokens."""
    tok = engine.lm.tokenizer
    ts = TextStream(tok, stop)
    smp = Sampler(**s["sampler"])
    sf = s["score_from"] or len(s["prompt"])
    g = generate(engine, s["prompt"], s["max_new"], smp, eos_ids=engine.lm.tok_meta["eos_token_ids"],
                 on_token=lambda t: ts.push(t)[1])
    if g.stop != "stop":
        ts.flush()
    want = dict(tokens=g.tokens, hash=g.hash, text=ts.text,
                stop={"eos": "eos", "stop": "stop", "length": "length", "context": "context"}[g.stop])
    ids = s["prompt"] + g.tokens
    rows = engine.new_state(len(ids)).forward(ids, all_logits=True)
    ls = LogSoftmax(rows)
    if s["logprobs"] is not None:
        p = len(s["prompt"]) - 1
        want["logprobs"] = [(t, ls.logprob_q(p + j, t), ls.top(p + j, s["logprobs"])) for j, t in enumerate(g.tokens)]
    if s["prompt_logprobs"] is not None:
        want["prompt_logprobs"] = [(s["prompt"][p + 1], ls.logprob_q(p, s["prompt"][p + 1]),
                                    ls.top(p, s["prompt_logprobs"])) for p in range(len(s["prompt"]) - 1)]
    if sf < len(s["prompt"]):  # a scored continuation: generate from the context, forced tokens
        from intdet.hashing import ChainHash

        ch = ChainHash(engine.lm.cfg["format_version"], engine.lm.model_sha256, s["prompt"][:sf])
        for p in range(sf - 1, len(s["prompt"]) - 1):
            ch.update(rows[p], s["prompt"][p + 1])
        for j, t in enumerate(g.tokens):
            ch.update(rows[len(s["prompt"]) - 1 + j], t)
        want["hash"] = ch.hex()
    return want


def make(engine, s, stop=(), on_event=None):
    return Request(s["prompt"], s["max_new"], Sampler(**s["sampler"]), eos_ids=engine.lm.tok_meta["eos_token_ids"],
                   stop=stop, logprobs=s["logprobs"], prompt_logprobs=s["prompt_logprobs"], score_from=s["score_from"],
                   on_event=on_event, tokenizer=engine.lm.tokenizer)


def got(r, streamed):
    out = dict(tokens=r.tokens, hash=r.hash, text=r.text, stop=r.finish_reason)
    if r.logprobs is not None:
        out["logprobs"] = [(t.token, t.logprob_q, t.top) for t in r.token_logprobs]
    if r.prompt_logprobs is not None:
        assert r.prompt_token_logprobs[0] is None
        out["prompt_logprobs"] = [(t.token, t.logprob_q, t.top) for t in r.prompt_token_logprobs[1:]]
    # what was streamed adds up to the result
    assert [e.token for e in streamed if e.kind == "token" and e.token is not None] == r.tokens
    assert "".join(e.text for e in streamed if e.kind == "token") == r.text
    assert streamed[-1].kind == "done" and sum(e.kind == "done" for e in streamed) == 1
    return out


@pytest.fixture(scope="module")
def reference(engine):
    ss = specs()
    # stop strings taken from the middle of two greedy texts, so that they fire
    stops = [()] * len(ss)
    texts = [alone(engine, s)["text"] for s in ss]
    for i in [i for i, t in enumerate(texts) if len(t) > 8][:3]:
        stops[i] = (texts[i][5:7], "never-there")
    return ss, stops, [alone(engine, s, st) for s, st in zip(ss, stops)]


@pytest.mark.parametrize("max_batch,step_tokens,kv_positions,order_seed", [
    (16, 512, 10**6, 0),  # everything at once, prompts whole
    (4, 5, 10**6, 1),     # few slots, prompts cut into chunks of <= 5 rows mixed with decode rows
    (16, 33, 400, 2),     # KV memory for ~2-4 sequences: the rest wait in the queue
    (2, 64, 10**6, 3),    # two slots
])
def test_concurrent_mixed_requests_equal_alone(engine, reference, max_batch, step_tokens, kv_positions, order_seed):
    ss, stops, want = reference
    sch = Scheduler(engine, max_batch=max_batch, step_tokens=step_tokens,
                    kv_bytes=max(kv_positions, 200) * kv_bytes_per_position(engine.lm.cfg))
    order = list(np.random.default_rng(order_seed).permutation(len(ss)))
    events = {i: [] for i in range(len(ss))}
    reqs = {}
    # arrivals: a third at once, the rest one every other step
    first, later = order[:len(order) // 3], order[len(order) // 3:]
    for i in first:
        reqs[i] = sch.submit(make(engine, ss[i], stops[i], events[i].append))
    steps = 0
    while not sch.idle or later:
        if later and steps % 2 == 0:
            i = later.pop(0)
            reqs[i] = sch.submit(make(engine, ss[i], stops[i], events[i].append))
        sch.step()
        steps += 1
        assert sch.kv_used <= sch.kv_bytes and len(sch.running) <= max_batch
    assert sch.kv_used == 0
    for i in range(len(ss)):
        assert got(reqs[i], events[i]) == want[i], f"request {i}"
    if kv_positions == 400:
        assert sch.max_running_seen < len(ss)  # memory, not the slot count, limited the batch
    assert {w["stop"] for w in want} >= {"length", "stop"}


def test_threaded_loop_with_many_clients(engine, reference):
    """The server's mode: the loop thread steps while client threads submit."""
    ss, stops, want = reference
    sch = Scheduler(engine, max_batch=8, step_tokens=64)
    sch.start()
    reqs, events = {}, {i: [] for i in range(len(ss))}

    def client(idx):
        for i in idx:
            reqs[i] = sch.submit(make(engine, ss[i], stops[i], events[i].append))
            reqs[i].wait(60)

    ths = [threading.Thread(target=client, args=(list(range(k, len(ss), 4)),)) for k in range(4)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(120)
    sch.shutdown(cancel=False, timeout=30)
    for i in range(len(ss)):
        assert got(reqs[i], events[i]) == want[i], f"request {i}"


def test_cancel_frees_the_slot_and_leaves_others_unchanged(engine, reference):
    ss, stops, want = reference
    sch = Scheduler(engine, max_batch=2, step_tokens=16)
    long_spec = dict(ss[0], max_new=200, logprobs=None, prompt_logprobs=None, score_from=None)
    victim = sch.submit(make(engine, long_spec))
    waiting = sch.submit(make(engine, long_spec))
    queued = sch.submit(make(engine, ss[2], stops[2]))  # waits for a slot
    cancelled_in_queue = sch.submit(make(engine, ss[3]))
    cancelled_in_queue.cancel()
    for _ in range(5):
        sch.step()
    assert queued._seq is None and not queued.done.is_set()
    n = len(victim.tokens)
    victim.cancel()
    waiting.cancel()
    sch.run_until_idle()
    assert victim.finish_reason == "cancelled" and len(victim.tokens) == n
    assert cancelled_in_queue.finish_reason == "cancelled" and cancelled_in_queue.tokens == []
    assert dict(tokens=queued.tokens, hash=queued.hash, text=queued.text, stop=queued.finish_reason) == \
        {k: want[2][k] for k in ("tokens", "hash", "text", "stop")}
    assert sch.kv_used == 0 and not sch.running and not sch.waiting


def test_requests_that_can_never_run_are_refused(engine):
    sch = Scheduler(engine, kv_bytes=100 * kv_bytes_per_position(engine.lm.cfg))
    ctx = engine.context_length
    for prompt, n, msg in (([], 4, "empty"), ([5, 320], 4, "outside the vocabulary"), ([-1], 4, "outside"),
                           ([5] * ctx, 1, "do not fit"),
                           ([5] * 90, 20, r"^max_tokens: the prompt and max_tokens need 110 positions, \d+ bytes of KV "
                                          r"cache, more than the budget of \d+ bytes \(kv_bytes")):
        with pytest.raises(IntdetError, match=msg):
            sch.submit(Request(prompt, n))
    with pytest.raises(IntdetError, match="max_batch"):
        Scheduler(engine, max_batch=0)
    per = kv_bytes_per_position(engine.lm.cfg)
    with pytest.raises(IntdetError, match=r"^kv_bytes: \d+ bytes hold fewer than the 2 positions") as e:
        Scheduler(engine, kv_bytes=2 * per - 1)  # refused where it is set, not at every request
    assert e.value.field == "kv_bytes"
    Scheduler(engine, kv_bytes=2 * per).submit(Request([5], 1))
    assert sch.idle


def test_a_request_is_checked_once(engine, monkeypatch):
    """Scheduler.check passes a request once: its submit does not check it
    again; a request nobody checked is checked by submit; the ids are not
    scanned when the caller has checked them (ids_checked)."""
    import intdet.request
    import intdet.scheduler

    checked, scanned = [], []
    real_check, real_scan = intdet.scheduler.check_request, intdet.request.check_token_ids
    monkeypatch.setattr(intdet.scheduler, "check_request", lambda req, *a: (checked.append(req), real_check(req, *a)))
    monkeypatch.setattr(intdet.request, "check_token_ids", lambda ids, *a: (scanned.append(ids), real_scan(ids, *a)))
    sch = Scheduler(engine)
    a, b, c = Request([5, 6], 2), Request([7], 1), Request([8], 1)
    sch.check(a)
    sch.check(c, ids_checked=True)
    for r in (a, b, c):
        sch.submit(r)
    assert checked == [a, c, b] and scanned == [[5, 6], [7]]
    sch.run_until_idle()
    assert [r.finish_reason for r in (a, b, c)] == ["length"] * 3
    with pytest.raises(IntdetError, match="^max_tokens: -1 must be >= 0$"):
        sch.check(Request([5], -1), ids_checked=True)  # the other checks still run


def test_shutdown_cancels_running_and_waiting(engine, monkeypatch):
    real = engine.forward_batch

    def slow(seqs, toks, all_logits=False):  # 250 steps take >= 1.2 s: the shutdown comes first
        time.sleep(0.005)
        return real(seqs, toks, all_logits=all_logits)

    monkeypatch.setattr(engine, "forward_batch", slow)
    sch = Scheduler(engine, max_batch=1, step_tokens=8)
    sch.start()
    a = sch.submit(Request([5, 6, 7], 250))
    b = sch.submit(Request([5, 6, 8], 250))
    while not a.tokens:
        a.wait(0.01)
    sch.shutdown(cancel=True, timeout=30)
    assert a.done.is_set() and b.done.is_set()
    assert a.finish_reason == "cancelled" and b.finish_reason == "cancelled" and b.tokens == []
    with pytest.raises(IntdetError, match="shutting down"):
        sch.submit(Request([5], 1))


def test_an_engine_failure_fails_its_requests_and_the_loop_goes_on(engine, monkeypatch):
    real = engine.forward_batch
    calls = []

    def flaky(seqs, toks, all_logits=False):
        calls.append(len(seqs))
        if len(calls) == 1:
            raise RuntimeError("device lost")
        return real(seqs, toks, all_logits=all_logits)

    monkeypatch.setattr(engine, "forward_batch", flaky)
    sch = Scheduler(engine, max_batch=4)
    sch.start()
    events = []
    a = sch.submit(Request([5, 6, 7], 4, on_event=events.append))
    a.wait(60)
    b = sch.submit(Request([5, 6, 7], 4))
    b.wait(60)
    sch.shutdown(cancel=False, timeout=30)
    assert a.finish_reason == "error" and "device lost" in a.error and events[-1].kind == "error"
    monkeypatch.setattr(engine, "forward_batch", real)
    g = generate(engine, [5, 6, 7], 4, Sampler(), eos_ids=engine.lm.tok_meta["eos_token_ids"])
    assert b.finish_reason == g.stop and b.tokens == g.tokens and b.hash == g.hash
    assert sch.kv_used == 0


class SecondBest:
    """A chooser for the test: the id of the second largest logit (lowest
    id on ties), found in numpy; refuses (-1) after ``refuse_after`` picks."""

    calls = 0

    def __init__(self, refuse_after=None):
        self.n, self.refuse_after = 0, refuse_after

    @classmethod
    def choose_rows(cls, choosers, rows):
        cls.calls += 1
        out = []
        for c, row in zip(choosers, rows):
            c.n += 1
            order = np.lexsort((np.arange(len(row)), -np.asarray(row, np.int64)))
            out.append(-1 if c.refuse_after is not None and c.n > c.refuse_after else int(order[1]))
        return out


def second_best_alone(engine, prompt, n):
    """The plain loop with the chooser's rule: one forward per token."""
    seq = engine.new_state(len(prompt) + n)
    logits = seq.forward(prompt)[-1]
    toks = []
    for _ in range(n):
        order = np.lexsort((np.arange(len(logits)), -logits.astype(np.int64)))
        toks.append(int(order[1]))
        if len(toks) < n:
            logits = seq.forward([toks[-1]])[-1]
    return toks


def test_chooser_requests_batched_with_sampled_ones(engine, reference):
    """Requests whose tokens a chooser picks (decompression's range decoder)
    run beside sampled ones: each chooser class called once per step, the
    tokens those of the plain loop with the same rule, the sampled requests
    unchanged; a chooser's -1 retires its request with CHOOSER_REFUSED."""
    from intdet.scheduler import CHOOSER_REFUSED

    sched = Scheduler(engine, max_batch=8, step_tokens=64)
    chosen = [Request([1 + i, 7, 9 + i], 6 + i, chooser=SecondBest()) for i in range(3)]
    refused = Request([3, 4], 10, chooser=SecondBest(refuse_after=2))
    ss, stops, want = reference
    sampled = [make(engine, s, st) for s, st in zip(ss[:4], stops)]
    for r in chosen + [refused] + sampled:
        sched.submit(r)
    SecondBest.calls = 0
    sched.run_until_idle()
    assert SecondBest.calls <= sched.steps
    for i, r in enumerate(chosen):
        assert r.finish_reason == "length"
        assert r.tokens == second_best_alone(engine, [1 + i, 7, 9 + i], 6 + i)
    assert refused.finish_reason == "error" and refused.error == CHOOSER_REFUSED and len(refused.tokens) == 2
    for w, r in zip(want, sampled):
        assert (r.tokens, r.hash) == (w["tokens"], w["hash"])
