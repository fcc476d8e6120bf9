"""Speculative decoding with prompt-lookup drafts (speculate.py, the
scheduler's step): whatever is drafted and kept, every request's tokens,
text, log-probabilities and chain hash equal plain decoding's, greedy and
sampled, in any batch and token budget; drafts are really kept on
repetitive text (else these tests could not fail); rejected drafts' KV
entries are dropped (State.truncate) on every backend."""

import numpy as np
import pytest
from test_scheduler import engine, got, make, reference, specs  # noqa: F401  (fixtures)

from intdet.errors import IntdetError
from intdet.sampling import Sampler
from intdet.scheduler import Request, Scheduler
from intdet.speculate import DraftState, ngram_drafts


def test_ngram_drafts():
    assert ngram_drafts([1, 2, 3, 9, 1, 2, 3], 2) == [9, 1]  # the 3-gram 1 2 3 recurs: what followed it
    assert ngram_drafts([5, 1, 2, 7, 1, 2, 8, 1, 2], 3) == [8, 1, 2]  # the latest earlier occurrence
    assert ngram_drafts([4, 7, 7, 7], 5) == [7]  # the suffix 7 7 recurs at 1: what follows it there is 7
    assert ngram_drafts([1, 2, 3, 4], 3) == []  # nothing recurs
    assert ngram_drafts([1, 1], 0) == [] and ngram_drafts([1], 4) == []
    assert ngram_drafts([3, 4, 9, 4], 2, min_n=1) == [9, 4]  # only the 1-gram 4 recurs
    assert ngram_drafts([3, 4, 9, 4], 2) == []  # by default a match is of 2 tokens at least


def test_draft_state_backs_off_and_recovers():
    d = DraftState(8)
    assert d.want() == 8
    d.record(8, 0)  # nothing kept: wait a step, then draft one
    assert (d.want(), d.want()) == (0, 1)
    d.record(1, 0)  # again: wait two steps
    assert [d.want() for _ in range(3)] == [0, 0, 1]
    d.record(1, 1)  # all kept: grow
    assert d.want() == 2
    d.record(2, 1)
    assert d.want() == 2 and (d.drafted, d.accepted, d.steps) == (12, 2, 4)
    d.record(0, 0)  # a step without drafts changes nothing
    assert d.steps == 4


def _run(engine, ss, stops, spec_tokens, max_batch=16, step_tokens=512):
    sch = Scheduler(engine, max_batch=max_batch, step_tokens=step_tokens, kv_bytes=1 << 40, spec_tokens=spec_tokens)
    events = [[] for _ in ss]
    reqs = [sch.submit(make(engine, s, st, on_event=events[i].append)) for i, (s, st) in enumerate(zip(ss, stops))]
    sch.run_until_idle()
    return sch, reqs, events


@pytest.mark.parametrize("spec_tokens,max_batch,step_tokens", [(1, 16, 512), (4, 16, 512), (8, 3, 7), (16, 2, 64)])
def test_speculative_requests_equal_plain(engine, reference, spec_tokens, max_batch, step_tokens):  # noqa: F811
    """The scheduler's mixed requests (greedy and sampled, log-probabilities,
    prompt log-probabilities, scored continuations, stop strings), drafted,
    against each one run alone by the reference loop (tests/oracle.py)."""
    ss, stops, want = reference
    sch, reqs, events = _run(engine, ss, stops, spec_tokens, max_batch, step_tokens)
    for r, ev, w in zip(reqs, events, want):
        assert got(r, ev) == w
    assert sch.spec_drafted > 0 and sch.spec_drafted == sum(r.spec_drafted for r in reqs)


def _repetitive(engine, n=6):
    """Prompts that repeat a random phrase: the text the lookup predicts."""
    rng = np.random.default_rng(11)
    out = []
    for i in range(n):
        phrase = [int(t) for t in rng.integers(3, 300, int(rng.integers(3, 9)))]
        sampler = {} if i % 2 == 0 else dict(temperature="0.7", seed=int(rng.integers(0, 2**63)))
        out.append(dict(prompt=phrase * 6, max_new=48, sampler=sampler, logprobs=None if i % 3 else 2,
                        prompt_logprobs=None, score_from=None))
    return out


def test_drafts_are_kept_on_repetitive_text_and_change_nothing(engine):  # noqa: F811
    ss = _repetitive(engine)
    stops = [()] * len(ss)
    sch0, plain, ev0 = _run(engine, ss, stops, 0, max_batch=1)  # one at a time: steps count each one's calls
    sch, spec, ev1 = _run(engine, ss, stops, 6, max_batch=1)
    for a, b, ea, eb in zip(plain, spec, ev0, ev1):
        assert got(b, eb) == got(a, ea) and b.hashes == a.hashes
    kept = sum(r.spec_accepted for r in spec)
    # (deterministic: 53 of 288 tokens came from kept drafts when this was written)
    assert kept > 0.1 * sum(len(r.tokens) for r in spec), (kept, [r.spec_drafted for r in spec])
    assert sch.steps < sch0.steps  # kept drafts saved forward calls


@pytest.mark.cuda
def test_speculation_on_the_numpy_spec_and_the_cuda_emulator(engine, monkeypatch):  # noqa: F811
    """State.truncate on the ref backend (positions indexed absolutely)
    and on the CUDA module (host emulator): drafted runs equal plain ones."""
    from intdet.model import Engine
    from test_cuda import _emu_or_skip

    ss = _repetitive(engine, 2)
    for s in ss:
        s["prompt"], s["max_new"] = s["prompt"][:20], 12
    stops = [()] * len(ss)
    _, want, _ = _run(engine, ss, stops, 0)
    ref = Engine(engine.lm, "ref")
    _, got_ref, _ = _run(ref, ss, stops, 4)
    assert [(r.tokens, r.hash) for r in got_ref] == [(r.tokens, r.hash) for r in want]
    monkeypatch.setattr("intdet.backends.cuda.cuda_module", lambda: _emu_or_skip())
    emu = Engine(engine.lm, "cuda")
    sch, got_emu, _ = _run(emu, ss, stops, 4)
    assert [(r.tokens, r.hash) for r in got_emu] == [(r.tokens, r.hash) for r in want]
    assert sch.spec_accepted > 0


def test_truncate_bounds(engine):  # noqa: F811
    s = engine.new_state(16)
    s.forward([5, 6, 7])
    for bad in (-1, 4, True, 1.5):
        with pytest.raises(IntdetError, match="truncate: .* is outside \\[0, 3\\]"):
            s.truncate(bad)
    s.truncate(1)
    assert s.n_past == 1 and s._state.n_past == 1
    a = s.forward([9])
    b = engine.new_state(16)
    assert np.array_equal(a, b.forward([5, 9]))  # position 1 written over: as if 6, 7 never ran


def test_spec_tokens_argument_checked(engine):  # noqa: F811
    for bad in (-1, 65, True, 2.0):
        with pytest.raises(IntdetError, match="spec_tokens"):
            Scheduler(engine, spec_tokens=bad)


def test_cli_generate_spec_ngram_same_text_and_hash(tmp_path, engine):  # noqa: F811
    """`intdet generate --spec-ngram K` prints what plain generate prints,
    and --json reports the drafts."""
    import json
    import subprocess
    import sys

    prompt = "the cat and the dog and the cat and the dog and the cat and the"
    base = [sys.executable, "-m", "intdet", "generate", "-m", engine.lm.path, "-n", "24", "--json", prompt]
    a = json.loads(subprocess.run(base, capture_output=True, text=True, check=True).stdout)
    b = json.loads(subprocess.run(base + ["--spec-ngram", "5"], capture_output=True, text=True, check=True).stdout)
    assert (a["text"], a["tokens"], a["hash"]) == (b["text"], b["tokens"], b["hash"])
    assert b["spec_drafted"] >= b["spec_accepted"] >= 0 and "spec_drafted" not in a
    r = subprocess.run(base + ["--spec-ngram", "65"], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("intdet: error: --spec-ngram: 65 is not in the range")


def test_request_api_reports_drafts(engine):  # noqa: F811
    sch = Scheduler(engine, spec_tokens=3)
    r = sch.submit(Request([7, 8, 9] * 8, 20, Sampler()))
    sch.run_until_idle()
    assert r.finish_reason in ("length", "eos") and r.spec_drafted >= r.spec_accepted
    assert specs  # (imported for the reference fixture)


# ---------------------------------------------------------------- draft model


def _draft_run(engine, ss, stops, draft_engine, k, max_batch=16, step_tokens=512):
    from intdet.speculate import DraftModel

    sch = Scheduler(engine, max_batch=max_batch, step_tokens=step_tokens, kv_bytes=1 << 40, spec_tokens=k,
                    draft=DraftModel(draft_engine, engine.vocab_size))
    events = [[] for _ in ss]
    reqs = [sch.submit(make(engine, s, st, on_event=events[i].append)) for i, (s, st) in enumerate(zip(ss, stops))]
    sch.run_until_idle()
    return sch, reqs, events


@pytest.mark.parametrize("k,max_batch,step_tokens", [(4, 16, 512), (3, 3, 7)])
def test_draft_model_requests_equal_plain(engine, reference, tmp_path_factory, tiny_qwen3_hf, k, max_batch,  # noqa: F811
                                          step_tokens):
    """Drafts from a draft model (the target itself: every greedy draft is
    kept; another model with the same tokenizer: some are), the mixed
    requests against each one run alone: the same bits either way."""
    from intdet.convert import convert
    from intdet.model import Engine, load_model

    ss, stops, want = reference
    other = Engine(load_model(convert(tiny_qwen3_hf, str(tmp_path_factory.mktemp("d") / "q"), progress=False)))
    for draft in (Engine(engine.lm), other):
        sch, reqs, events = _draft_run(engine, ss, stops, draft, k, max_batch, step_tokens)
        for r, ev, w in zip(reqs, events, want):
            assert got(r, ev) == w
        assert sch.spec_drafted > 0
        if draft is not other:  # the target drafting for itself: every greedy request keeps all its drafts
            greedy = [r for r, s, st in zip(reqs, ss, stops) if not s["sampler"] and not st and r.spec_drafted
                      and r.finish_reason == "length"]  # (an eos or a stop string ends a request mid-draft)
            assert greedy and all(r.spec_accepted == r.spec_drafted for r in greedy), [
                (r.spec_accepted, r.spec_drafted, r.finish_reason) for r in greedy]


def test_draft_model_saves_forward_calls(engine):  # noqa: F811
    """Greedy decoding with the target as its own draft: k+1 tokens per
    forward call of the target, and the same tokens and hash."""
    from intdet.model import Engine
    from intdet.speculate import DraftModel

    prompt = [5, 17, 99, 230, 41]
    plain = Scheduler(engine, kv_bytes=1 << 40)
    a = plain.submit(Request(prompt, 40))
    plain.run_until_idle()
    spec = Scheduler(engine, kv_bytes=1 << 40, spec_tokens=4, draft=DraftModel(Engine(engine.lm), engine.vocab_size))
    b = spec.submit(Request(prompt, 40))
    spec.run_until_idle()
    assert (a.tokens, a.hash) == (b.tokens, b.hash) and b.spec_accepted == b.spec_drafted > 0
    assert spec.steps <= plain.steps // 4 + 2


def test_draft_model_with_another_tokenizer_is_refused(engine, tmp_path):  # noqa: F811
    """A draft whose tokenizer maps one string to another id: refused, naming draft_model."""
    import json
    import shutil

    import intdet

    d = tmp_path / "draft"
    shutil.copytree(engine.lm.path, d)
    tj = json.loads((d / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two ids swapped: the same strings, other ids
    (d / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(IntdetError) as e:
        intdet.LLM(engine.lm, draft_model=str(d))
    assert e.value.field == "draft_model" and "tokenizer" in str(e.value) and "\n" not in str(e.value)


def test_cli_generate_spec_draft(tmp_path, engine):  # noqa: F811
    """`intdet generate --spec-draft MODEL` prints what plain generate prints;
    --json reports the drafts; bad combinations are one-line errors."""
    import json
    import subprocess
    import sys

    base = [sys.executable, "-m", "intdet", "generate", "-m", engine.lm.path, "-n", "24", "--json", "hello there"]
    a = json.loads(subprocess.run(base, capture_output=True, text=True, check=True).stdout)
    r = subprocess.run(base + ["--spec-draft", engine.lm.path, "--spec-draft-max", "3"], capture_output=True, text=True)
    b = json.loads(r.stdout)
    assert (a["text"], a["tokens"], a["hash"]) == (b["text"], b["tokens"], b["hash"])
    assert b["spec_drafted"] == b["spec_accepted"] > 0
    for extra, msg in ((["--spec-draft", engine.lm.path, "--spec-ngram", "3"], "--spec-draft: give --spec-ngram or"),
                       (["--spec-draft", str(tmp_path / "nope")], "--spec-draft: ")):
        r = subprocess.run(base + extra, capture_output=True, text=True)
        assert r.returncode == 1 and r.stdout == "" and r.stderr.startswith("intdet: error: " + msg), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_serve_spec_draft_same_outputs(engine):  # noqa: F811
    """`intdet serve --spec-draft MODEL`: completions equal the API's plain runs."""
    import signal

    import intdet
    from test_serve import post, start_server

    proc, port = start_server(engine.lm.path, "--spec-draft", engine.lm.path, "--spec-draft-max", "3")
    try:
        llm = intdet.LLM(engine.lm)
        for body in ({"prompt": "hello there", "max_tokens": 20, "temperature": 0, "seed": 0},
                     {"prompt": [5, 17, 99], "max_tokens": 16, "temperature": 0.8, "seed": 4}):
            status, r = post(port, "/v1/completions", body)
            assert status == 200, r
            want = llm.generate(body["prompt"], intdet.SamplingParams(max_tokens=body["max_tokens"],
                                                                     temperature=body["temperature"], seed=body["seed"]))
            assert (r["choices"][0]["text"], r["choices"][0]["hash"]) == (want.text, want.hash)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
