"""The generation loop (the scheduler's step) as ``intdet generate`` and
chat drive it: chunked prefill (bit-identical for every split, progress,
Ctrl-C between chunks), stop reasons, truncation; TextStream stop sequences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import models
from intdet.generate import TextStream, truncate_prompt
from intdet.sampling import Sampler
from intdet.scheduler import Request, Scheduler
from oracle import generate

CTX = models.TINY["max_position_embeddings"]  # 256


@pytest.fixture(scope="module")
def engine(tiny_llama_hf, tmp_path_factory):
    from intdet.convert import convert
    from intdet.model import Engine, load_model

    out = convert(tiny_llama_hf, str(tmp_path_factory.mktemp("loop") / "m"), progress=False)
    return Engine(load_model(out), "cpu")


PROMPT = [int(x) for x in np.random.default_rng(5).integers(3, 300, size=200)]


def run(engine, prompt, n, sampler=None, chunk=256, on_prefill=None):
    """One request through the scheduler, as ``intdet generate`` runs it."""
    sched = Scheduler(engine, max_batch=1, step_tokens=chunk, kv_bytes=1 << 62)
    req = sched.submit(Request(prompt, n, sampler, on_prefill=on_prefill))
    try:
        sched.run_until_idle()
    except KeyboardInterrupt:  # what the CLI does on Ctrl-C
        req.cancel()
        sched.run_until_idle()
    return req


def test_prefill_logits_identical_for_every_split(engine):
    """All bits of all prompt positions' logits, whole against chunked."""
    whole = engine.new_state(CTX).forward(PROMPT, all_logits=True)
    for chunk in (1, 7, 64, 100, 199):
        seq = engine.new_state(CTX)
        parts = [seq.forward(PROMPT[i:i + chunk], all_logits=True) for i in range(0, len(PROMPT), chunk)]
        got = np.concatenate(parts)
        assert got.dtype == whole.dtype and got.shape == whole.shape
        assert got.tobytes() == whole.tobytes(), chunk


@pytest.mark.parametrize("sampler", [Sampler(), Sampler(temperature="0.9", seed=3, repeat_penalty="1.3")],
                         ids=["greedy", "sampled"])
def test_generate_same_for_every_prefill_chunk(engine, sampler):
    ref = generate(engine, PROMPT, 12, sampler, prefill_chunk=0)
    for chunk in (1, 7, 64, 256, 512):
        r = run(engine, PROMPT, 12, sampler, chunk=chunk)
        assert r.tokens == ref.tokens and r.hashes == ref.hashes and r.hash == ref.hash, chunk


def test_prefill_progress_and_interrupt_between_chunks(engine):
    seen = []

    def on_prefill(done, total):
        seen.append((done, total))
        if len(seen) == 2:
            raise KeyboardInterrupt  # what Ctrl-C raises once a chunk's C++ call returns

    r = run(engine, PROMPT, 12, chunk=64, on_prefill=on_prefill)
    assert seen == [(64, 200), (128, 200)]
    assert r.finish_reason == "cancelled" and r.tokens == []
    assert r.hash == generate(engine, PROMPT, 0).hash  # the hash of the prompt alone
    seen.clear()
    run(engine, PROMPT[:130], 1, chunk=64, on_prefill=lambda d, t: seen.append(d))
    assert seen == [64, 128, 130]


def test_stop_reasons(engine):
    assert run(engine, PROMPT, 3).finish_reason == "length"
    r = run(engine, [5] * (CTX - 4), 100)
    assert r.finish_reason == "context" and len(r.tokens) == 5  # the last one chosen, never fed
    assert r.hash == generate(engine, [5] * (CTX - 4), 100).hash


def test_truncate_prompt():
    p = list(range(10, 310))
    left = truncate_prompt(p, CTX, 16, "left")
    assert left == p[-(CTX - 16):]
    assert truncate_prompt(p, CTX, 16, "right") == p[:CTX - 16]
    assert truncate_prompt(p, CTX, 10**9, "right") == p[:CTX // 2]  # room for at most half the context
    assert truncate_prompt(p, CTX, 0, "right") == p[:CTX - 1]  # at least one token of room
    bos = [1] + p
    cut = truncate_prompt(bos, CTX, 16, "left", bos_id=1)
    assert cut[0] == 1 and cut[1:] == p[-(CTX - 17):] and len(cut) == CTX - 16
    assert truncate_prompt(p[:20], CTX, 16, "left") == p[:20]


def test_generate_truncates(engine):
    import intdet

    p = [int(x) for x in np.random.default_rng(6).integers(3, 300, size=300)]
    llm = intdet.LLM(engine.lm)
    c = llm.generate(p, intdet.SamplingParams(max_tokens=8, truncate="left"))
    assert c.prompt_ids == p[-(CTX - 8):] and c.truncated == 300 - (CTX - 8)
    assert c.hash == generate(engine, p[-(CTX - 8):], 8).hash


# ------------------------------------------------------------- TextStream


class FakeTok:
    """Each id is one piece of text (id -> pieces[id])."""

    def __init__(self, pieces):
        self.pieces = pieces

    def id_to_token(self, i):
        return self.pieces[i] if 0 <= i < len(self.pieces) else None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.pieces[i] for i in ids)


@pytest.fixture
def fake_stream(monkeypatch):
    import intdet.tokenizer as tk

    class Dec:  # StreamDecoder on FakeTok: one piece per push
        def __init__(self, tok, skip_special_tokens=True):
            self.tok = tok

        def push(self, i):
            return self.tok.pieces[i]

        def flush(self):
            return ""

    monkeypatch.setattr(tk, "StreamDecoder", Dec)
    return lambda pieces, stop: TextStream(FakeTok(pieces), stop)


def test_stop_sequence_spanning_tokens(fake_stream):
    ts = fake_stream(["Hel", "lo, wo", "rld", "!"], ["o, world"])
    outs = [ts.push(i) for i in range(4)]
    assert outs[0] == ("Hel", False)
    assert outs[1] == ("l", False)  # "o, wo" held back: it may start the stop sequence
    assert outs[2] == ("", True)  # stop found: nothing of it printed
    assert outs[3] == ("", True)
    assert ts.text == "Hell" and ts.flush() == ""


def test_held_text_released_when_no_stop(fake_stream):
    ts = fake_stream(["ab", "c", "x", "ab"], ["abd"])
    assert [ts.push(i)[0] for i in range(4)] == ["", "abc", "x", ""]
    assert ts.flush() == "ab" and ts.text == "abcxab"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text("ab\n", max_size=4), min_size=1, max_size=12), st.lists(st.text("ab\n", min_size=1, max_size=4),
                                                                                 max_size=3))
@example(pieces=["b\n\n", "a"], stops=["\n", "b\n\na"])  # found by hypothesis against the old oracle
def test_stream_equals_cut_text(fake_stream, pieces, stops):
    """Whatever the split into tokens, generation stops at the first token
    whose text completes a stop sequence, and the printed text is the text
    so far cut before the earliest stop sequence in it (all of it when none
    occurs). A longer stop that would start earlier but is not complete yet
    never wins: the tokens that would complete it are not generated."""
    ts = fake_stream(pieces, stops)
    printed = ""
    for i in range(len(pieces)):
        out, stopped = ts.push(i)
        printed += out
        if stopped:
            break
    printed += ts.flush()
    full = ""
    for piece in pieces:
        full += piece
        if any(s in full for s in stops):
            break
    hits = [full.find(s) for s in stops if s in full]
    want = full[:min(hits)] if hits else full
    assert printed == want == ts.text
