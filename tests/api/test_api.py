"""The public Python API (intdet.load / LLM): generate one or many, stream,
chat and score, each equal to `intdet generate` run alone (tokens, text,
chain hash)."""

import json
import os
import subprocess
import sys

import pytest

import intdet
from intdet.convert import convert
from intdet.errors import IntdetError
from intdet.generate import TextStream
from oracle import generate
from intdet.logprobs import LogSoftmax
from intdet.sampling import Sampler


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_llama_hf):
    return convert(tiny_llama_hf, str(tmp_path_factory.mktemp("api") / "m"), progress=False)


@pytest.fixture(scope="module")
def llm(model_dir):
    return intdet.load(model_dir, max_batch=4, step_tokens=16)


def alone(llm, ids, n, sampler=None, stop=()):
    ts = TextStream(llm.tokenizer, stop)
    g = generate(llm.engine, ids, n, sampler or Sampler(), eos_ids=llm.eos_ids, on_token=lambda t: ts.push(t)[1])
    if g.stop != "stop":
        ts.flush()
    return g, ts.text


def test_public_names():
    for name in ("LLM", "load", "SamplingParams", "Completion", "StreamChunk", "Stream", "Score", "TokenLogprob",
                 "derive_seed"):
        assert getattr(intdet, name) is getattr(intdet.api, name)
    with pytest.raises(AttributeError):
        intdet.nothing_here  # noqa: B018


def test_generate_one_equals_cli(llm, model_dir):
    c = llm.generate([5, 17, 99, 230], intdet.SamplingParams(max_tokens=12, temperature="0.8", seed=11))
    out = subprocess.run([sys.executable, "-m", "intdet", "generate", "-m", model_dir, "--ids", "5,17,99,230", "-n", "12",
                          "--temperature", "0.8", "--seed", "11", "--json"], capture_output=True, text=True, check=True)
    cli = json.loads(out.stdout)
    assert (c.tokens, c.hash, c.text, c.seed) == (cli["tokens"], cli["hash"], cli["text"], 11)
    assert c.hashes == cli["hashes"] or {str(k): v for k, v in c.hashes.items()} == cli["hashes"]
    assert c.finish_reason == cli["stop"] and c.prompt_ids == [5, 17, 99, 230]


def test_generate_many_batched_equals_each_alone(llm):
    prompts = ["hello world", [7, 8, 9], "a much longer prompt " * 6, [300]]
    params = [intdet.SamplingParams(max_tokens=n, temperature=t, seed=s, top_k=k, stop=st)
              for n, t, s, k, st in ((20, 0, 0, 0, ()), (9, "1.1", 5, 40, ()), (30, 0.7, 2, 0, ("e",)), (0, 0, 0, 0, ()))]
    outs = llm.generate(prompts, params)
    assert len(outs) == 4
    for p, sp, c in zip(prompts, params, outs):
        ids = llm.encode(p) if isinstance(p, str) else p
        g, text = alone(llm, ids, sp.max_tokens, sp.sampler(), sp.stop)
        assert (c.tokens, c.hash, c.text) == (g.tokens, g.hash, text)
    # one SamplingParams for every prompt
    same = llm.generate(["x", "x", "x"], intdet.SamplingParams(max_tokens=6, temperature=1, seed=3))
    assert len({(c.hash, tuple(c.tokens)) for c in same}) == 1


def test_stop_reason_names_the_stop_string(llm):
    """Completion.stop_reason: the stop string that ended it (vLLM's; the
    server's "stop_reason" reads it), None for any other ending."""
    free = llm.generate("hello", intdet.SamplingParams(max_tokens=24))
    assert free.stop_reason is None and len(free.text) > 4, free
    stop = free.text[2:4]
    c = llm.generate("hello", intdet.SamplingParams(max_tokens=24, stop=["never there \u2603", stop]))
    assert (c.finish_reason, c.stop_reason) == ("stop", stop) and free.text.startswith(c.text)


def test_logprobs_are_the_fixed_point_log_softmax(llm):
    c = llm.generate("hello", intdet.SamplingParams(max_tokens=6, logprobs=3, prompt_logprobs=2))
    ids = c.prompt_ids + c.tokens
    rows = llm.engine.new_state(len(ids)).forward(ids, all_logits=True)
    ls = LogSoftmax(rows)
    p0 = len(c.prompt_ids) - 1
    assert [(t.token, t.logprob_q, t.top) for t in c.logprobs] == \
        [(tok, ls.logprob_q(p0 + j, tok), ls.top(p0 + j, 3)) for j, tok in enumerate(c.tokens)]
    assert c.prompt_logprobs[0] is None and len(c.prompt_logprobs) == len(c.prompt_ids)
    assert [t.logprob_q for t in c.prompt_logprobs[1:]] == [ls.logprob_q(p, c.prompt_ids[p + 1]) for p in range(p0)]
    assert c.logprobs[0].logprob == c.logprobs[0].logprob_q / 2**24
    assert c.cumulative_logprob == sum(t.logprob_q for t in c.logprobs) / 2**24
    # greedy: every chosen token is the most likely one
    assert all(t.logprob_q == t.top[0][1] for t in c.logprobs)


def test_stream_adds_up_and_stops_early(llm):
    sp = intdet.SamplingParams(max_tokens=25, temperature="0.9", seed=4)
    chunks = list(llm.stream("stream me", sp))
    last = chunks[-1]
    assert last.finish_reason and last.completion is not None
    assert [c.token for c in chunks if c.token is not None] == last.completion.tokens
    assert "".join(c.text for c in chunks) == last.completion.text
    g, text = alone(llm, llm.encode("stream me"), 25, sp.sampler())
    assert (last.completion.tokens, last.completion.hash, last.completion.text) == (g.tokens, g.hash, text)
    # leaving the loop cancels the request and frees its slot
    for i, _ in enumerate(llm.stream("stream me", intdet.SamplingParams(max_tokens=200))):
        if i == 2:
            break
    assert llm.scheduler.idle and llm.scheduler.kv_used == 0


def test_stream_close_keeps_what_was_made(llm):
    """close() after k tokens: a "cancelled" Completion with exactly those
    tokens, and the chain hash and text of the same request stopped by
    max_tokens=k; on_prefill saw every prompt chunk (step_tokens=16)."""
    ids = list(range(3, 3 + 40))
    seen = []
    sp = intdet.SamplingParams(max_tokens=100, temperature="0.7", seed=9)
    s = llm.stream(ids, sp, on_prefill=lambda done, total: seen.append((done, total)))
    got = []
    for chunk in s:
        got += [chunk.token] if chunk.token is not None else []
        if len(got) == 6:
            break
    c = s.close()
    assert seen == [(16, 40), (32, 40), (40, 40)]
    assert c.finish_reason == "cancelled" and c.tokens == got and len(got) == 6
    g, text = alone(llm, ids, 6, sp.sampler())
    assert (c.tokens, c.hash, c.text) == (g.tokens, g.hash, text)
    assert s.close() is c and list(s) == [] and llm.scheduler.idle and llm.scheduler.kv_used == 0
    with llm.stream(ids, sp) as s2:  # the with block closes it too
        next(s2)
    assert s2.completion.finish_reason == "cancelled" and llm.scheduler.idle


def test_stream_refuses_bad_input_before_running(llm):
    """A bad prompt or parameter is an IntdetError naming it, raised by
    stream() itself: nothing is queued, the scheduler stays idle."""
    def bad(**kw):  # SamplingParams refuses these when made: set them after, as a caller might
        sp = intdet.SamplingParams()
        for k, v in kw.items():
            setattr(sp, k, v)
        return sp

    for prompt, sp, word in (([], intdet.SamplingParams(), "prompt"), ([10**9], intdet.SamplingParams(), "vocabulary"),
                             ("hi", bad(max_tokens=-1), "max_tokens"),
                             ("hi", bad(temperature="hot"), "temperature")):
        with pytest.raises(IntdetError, match=word):
            llm.stream(prompt, sp)
        assert llm.scheduler.idle and llm.scheduler.kv_used == 0


def test_cli_generate_runs_through_the_api(model_dir, monkeypatch):
    """`intdet generate` drives the Python API's Stream (one code path for
    both), and its result is the API's."""
    from click.testing import CliRunner

    from intdet import api, cli

    made = []
    real = api.LLM.stream

    def spy(self, *a, **kw):
        made.append(real(self, *a, **kw))
        return made[-1]

    monkeypatch.setattr(api.LLM, "stream", spy)
    r = CliRunner().invoke(cli.main, ["generate", "-m", model_dir, "--ids", "4,5,6", "-n", "9", "--json", "-q"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert len(made) == 1 and made[0].completion.tokens == out["tokens"] and made[0].completion.hash == out["hash"]


def test_chat_equals_generate_of_template(llm):
    msgs = [{"role": "user", "content": "hi <|im_end|> there"}]
    c = llm.chat(msgs, intdet.SamplingParams(max_tokens=8))
    g, text = alone(llm, llm.chat_ids(msgs), 8)
    assert (c.tokens, c.hash) == (g.tokens, g.hash)
    assert [x.hash for x in llm.chat([msgs, msgs], intdet.SamplingParams(max_tokens=8))] == [c.hash, c.hash]


def test_score(llm):
    ctx = llm.encode("the quick brown")
    g, _ = alone(llm, ctx, 5)
    s = llm.score(ctx, g.tokens, top=2)
    assert s.is_greedy and s.hash == g.hash and s.continuation_ids == g.tokens
    assert s.logprob_q == sum(t.logprob_q for t in s.logprobs) and all(len(t.top) == 2 for t in s.logprobs)
    other = [(g.tokens[0] + 1) % llm.vocab_size] + g.tokens[1:]
    s2 = llm.score(ctx, other)
    assert not s2.is_greedy and s2.logprob_q < s.logprob_q and s2.logprobs[0].top == []
    # text continuation (no BOS) and batches of pairs give the same numbers
    both = llm.score([(ctx, g.tokens), ("the quick brown", " fox")])
    assert both[0].logprob_q == s.logprob_q and both[0].hash == s.hash
    assert both[1].context_ids == ctx and both[1].continuation_ids == llm.encode(" fox", add_bos=False)
    for top in (-1, 21, "2", True):
        with pytest.raises(IntdetError, match=r"top: .* must be an integer in \[0, 20\]"):
            llm.score(ctx, g.tokens, top=top)


@pytest.mark.parametrize("kw,msg", [
    (dict(temperature="hot"), "temperature: 'hot' is not a number"),
    (dict(temperature=101), "temperature: 101 is outside"),
    (dict(top_p=0), "top_p: 0 is outside"),
    (dict(top_k=-1), "top_k: -1 must be >= 0"),
    (dict(seed=-1), "seed: -1 must be in"),
    (dict(max_tokens=-2), "max_tokens"),
    (dict(max_tokens=True), "max_tokens"),
    (dict(logprobs=-1), "logprobs"),
    (dict(logprobs=21), r"logprobs: 21 must be None or an integer in \[0, 20\]"),  # the server's cap too
    (dict(prompt_logprobs=1000), r"prompt_logprobs: 1000 must be None or an integer in \[0, 20\]"),
    (dict(stop="x"), "stop: must be a list"),
    (dict(stop=5), "stop: must be a list of strings \\(got int\\)"),
    (dict(stop=["x", ""]), "^stop: an empty string never ends the text$"),  # it never fired
    (dict(truncate="middle"), "truncate"),
    (dict(seed=None), "^seed: None is not an integer$"),
    (dict(seed=1.5), "^seed: 1.5 is not an integer$"),  # "& MASK64" on a float was a TypeError when sampling
    (dict(seed=True), "^seed: True is not an integer$"),
    (dict(top_k=2.5), "^top_k: 2.5 is not an integer$"),
    (dict(repeat_last_n="8"), "^repeat_last_n: '8' is not an integer$"),
])
def test_bad_params_name_the_field(llm, kw, msg):
    """Refused where the SamplingParams is made (and so before anything runs)."""
    with pytest.raises(IntdetError, match=msg):
        intdet.SamplingParams(**kw)
    sp = intdet.SamplingParams()
    for k, v in kw.items():  # fields changed after construction: refused at generate
        setattr(sp, k, v)
    with pytest.raises(IntdetError, match=msg):
        llm.generate("x", sp)


def test_wrong_argument_types_are_intdet_errors(llm):
    for call, msg in ((lambda: llm.generate("a", {"max_tokens": 2}), "params: expected intdet.SamplingParams"),
                      (lambda: llm.generate(None), "prompts: expected a string"),
                      (lambda: llm.stream("a", 5), "params: expected intdet.SamplingParams"),
                      (lambda: llm.chat([{"role": "wizard", "content": "x"}]), "messages\\[0\\].role: 'wizard'"),
                      (lambda: intdet.load(threads=-1), "threads: -1 must be in \\[0, 1024\\] \\(0 = auto\\)")):
        with pytest.raises(IntdetError, match=msg):
            call()


def test_errors_carry_their_field(llm, model_dir):
    """Every IntdetError the API raises for an argument sets .field to the
    name its message starts with (the server maps it to the 400's param)."""
    calls = ((lambda: llm.generate(""), "prompt"), (lambda: llm.generate([[]]), "prompt"),
             (lambda: llm.generate(5), "prompts"), (lambda: llm.generate([]), "prompts"),
             (lambda: llm.generate("abc " * 200), "prompt"), (lambda: llm.score("a", ""), "continuation"),
             (lambda: llm.score("a", "b", top=-1), "top"), (lambda: llm.score([]), "score"),
             (lambda: llm.chat([{"role": "robot", "content": "x"}]), "messages"),
             (lambda: llm.generate("a", [intdet.SamplingParams()] * 2), "params"),
             (lambda: intdet.LLM(model_dir, max_batch=0), "max_batch"),
             (lambda: intdet.LLM(model_dir, step_tokens=0), "step_tokens"),
             (lambda: intdet.LLM(model_dir, spec_tokens=99), "spec_tokens"))
    for call, field in calls:
        with pytest.raises(IntdetError) as e:
            call()
        assert e.value.field == field and str(e.value).startswith(field), (field, str(e.value), e.value.field)


@pytest.mark.parametrize("kw, field, msg", [
    (dict(threads="2"), "threads", "^threads: '2' must be in"),
    (dict(device="tpu"), "device", "^device 'tpu' is not available"),  # was "--device 'tpu' ..."
    (dict(weights="int2"), "weights", "^weights 'int2': choose int8 or int4"),
])
def test_load_errors_name_the_argument(kw, field, msg):
    with pytest.raises(IntdetError, match=msg) as e:
        intdet.load(**kw)
    assert e.value.field == field


def test_loader_errors_carry_the_field(llm):
    """The loaders themselves name the API's argument and set the field (no
    CLI option spelling for the API to rewrite)."""
    from intdet.model import Engine
    from intdet.resolve import resolve_model

    for call, field, msg in ((lambda: resolve_model("/nonexistent/m.gguf"), "model", "model: /nonexistent/m.gguf: "),
                             (lambda: resolve_model(None, weights="int2"), "weights", "weights 'int2': "),
                             (lambda: Engine(llm.lm, "tpu"), "device", "device 'tpu' is not available"),
                             (lambda: Engine(llm.lm, "cpu", threads=-1), "threads", "threads: -1 must be")):
        with pytest.raises(IntdetError) as e:
            call()
        assert e.value.field == field and str(e.value).startswith(msg), (str(e.value), e.value.field)


def test_intdet_error_is_exported():
    """``except intdet.IntdetError`` (usage.md) catches what the API raises."""
    assert intdet.IntdetError is IntdetError and "IntdetError" in intdet.__all__
    with pytest.raises(intdet.IntdetError):
        intdet.SamplingParams(top_k=-1)


def test_bad_prompts(llm):
    for p, msg in (([], "empty list"), ([[]], "prompt: empty"), ([5, 999], "outside the vocabulary"),
                   ([1.5], "token ids"), ([5] * 300, "do not fit")):
        with pytest.raises(IntdetError, match=msg):
            llm.generate(p)
    c = llm.generate([5] * 300, intdet.SamplingParams(max_tokens=4, truncate="left"))
    assert c.truncated == 300 - len(c.prompt_ids) > 0
    with pytest.raises(IntdetError, match="messages"):
        llm.chat([{"role": "user"}])
    with pytest.raises(IntdetError, match=r"^prompt: character 2 is a lone surrogate \(U\+D800\), not text$"):
        llm.generate("ab\ud800")
    with pytest.raises(IntdetError, match=r"^messages\[1\]\.content: character 0 is a lone surrogate"):
        llm.chat([{"role": "user", "content": "hi"}, {"role": "user", "content": "\udfff"}])
    with pytest.raises(IntdetError, match="^model: .*missing: no such file"):
        intdet.load(os.path.join(os.path.dirname(llm.lm.path), "missing"))


def test_each_prompt_is_scanned_once(llm, monkeypatch):
    """generate, stream and score check a prompt's ids once (LLM.prompt_ids,
    naming the argument), not again in the scheduler's check or submit."""
    import intdet.api
    import intdet.request

    scans = []
    for mod in (intdet.api, intdet.request):
        real = mod.check_token_ids
        monkeypatch.setattr(mod, "check_token_ids", lambda ids, *a, real=real: (scans.append(list(ids)), real(ids, *a)))
    llm.generate([[5, 6], [7, 8, 9]], intdet.SamplingParams(max_tokens=2))
    assert scans == [[5, 6], [7, 8, 9]]
    scans.clear()
    list(llm.stream([5, 6], intdet.SamplingParams(max_tokens=2)))
    llm.score([5, 6], [7])
    assert scans == [[5, 6], [5, 6], [7]]


def test_llm_over_an_engine_runs_requests_it_is_given(llm):
    """LLM(engine) drives that engine as it is set (hash-check's and
    decompression's way into the one loop); ``run`` takes Requests that
    ``request`` cannot build (step hashes, no EOS) and stops at ``until``."""
    from intdet.scheduler import Request, Scheduler

    other = intdet.LLM(llm.engine, max_batch=2, step_tokens=3, prefix_cache=False)
    assert other.engine is llm.engine and other.scheduler.cache is None and other.scheduler.step_tokens == 3
    want = Request([5, 6, 7, 8], 6, step_hashes=True)
    sch = Scheduler(llm.engine, max_batch=2, step_tokens=3)
    sch.submit(want)
    sch.run_until_idle()
    got, co = Request([5, 6, 7, 8], 6, step_hashes=True), Request([9, 10], 6)
    other.run([got, co], until=lambda: len(got.tokens) >= 2)
    assert not got.done.is_set() and len(got.tokens) == 2
    other.run([], until=lambda: got.done.is_set() and co.done.is_set())
    assert (got.tokens, got.step_hashes, got.hash) == (want.tokens, want.step_hashes, want.hash)
    assert co.done.is_set() and other.scheduler.idle


def test_derive_seed():
    assert intdet.derive_seed(7, 0) == 7
    seeds = {intdet.derive_seed(7, i) for i in range(100)}
    assert len(seeds) == 100 and all(0 <= s < 2**64 for s in seeds)
    assert intdet.derive_seed(2**64 - 1, 0) == 2**64 - 1
    for args, field in (((-1, 0), "seed"), ((2**64, 0), "seed"), ((1.0, 0), "seed"), ((1, -1), "index")):
        with pytest.raises(IntdetError, match=f"^{field}: ") as e:  # was returned as given (-1, 2^64)
            intdet.derive_seed(*args)
        assert e.value.field == field


def test_check_token_ids_names_the_field():
    from intdet.errors import IntdetError, check_token_ids

    check_token_ids([0, 5, 9], 10, "prompt")
    with pytest.raises(IntdetError, match=r"^prompt: token id 10 is outside the vocabulary \[0, 10\)$") as e:
        check_token_ids([3, 10, -1], 10, "prompt")
    assert e.value.field == "prompt"
    with pytest.raises(IntdetError, match=r"^token id -1 is outside") as e:
        check_token_ids([-1], 10)
    assert e.value.field is None


def test_intdet_error_keeps_its_field_when_pickled():
    """Errors cross processes (batch workers, Ray actors) with their field,
    so the CLI can still spell the option and the server the param."""
    import pickle

    from intdet.errors import IntdetError

    e = pickle.loads(pickle.dumps(IntdetError("top_p: 2 is outside (0, 1]", field="top_p")))
    assert isinstance(e, IntdetError) and str(e) == "top_p: 2 is outside (0, 1]" and e.field == "top_p"
