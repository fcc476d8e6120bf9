"""`intdet serve` on a real loopback port: OpenAI/vLLM shapes, every response
equal to the same request run alone through the Python API (chain hash
included), lm-evaluation-harness's log-likelihood request, the openai client,
and hostile clients (bad JSON, wrong types, huge numbers, unknown fields,
oversized bodies, disconnects mid-stream, many at once); SIGTERM drains."""

import dataclasses
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import intdet
from intdet.convert import convert

KEY = "test-key-123"


def start_server(model_dir, *extra, key=KEY, env=None):
    args = [sys.executable, "-m", "intdet", "serve", "-m", model_dir, "--port", "0", "--threads", "1", *extra]
    if key:
        args += ["--api-key", key]
    env = dict(os.environ, INTDET_API_KEY="", **(env or {}))
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    deadline = time.monotonic() + 120
    line = ""
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if "listening on http://" in line or not line:
            break
    if "listening on http://" not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r} {proc.stderr.read()}")
    port = int(line.split("http://127.0.0.1:")[1].split()[0])
    proc.log = []  # the server's stderr after its first line, kept for the tests that read it

    def drain():
        for ln in proc.stderr:
            proc.log.append(ln)

    threading.Thread(target=drain, daemon=True).start()
    return proc, port


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_llama_hf):
    return convert(tiny_llama_hf, str(tmp_path_factory.mktemp("serve") / "tiny"), progress=False)


@pytest.fixture(scope="module")
def server(model_dir):
    proc, port = start_server(model_dir, "--max-batch", "4", "--step-tokens", "16", "--max-n", "4",
                              "--max-body-mib", "1")
    yield port
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


@pytest.fixture(scope="module")
def llm(model_dir):
    return intdet.load(model_dir, threads=1)


def request(port, method, path, body=None, key=KEY, raw=None, headers=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json", **(headers or {})}
    if key:
        h["Authorization"] = f"Bearer {key}"
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    try:
        return r.status, json.loads(text) if text else None
    except ValueError:
        return r.status, text


HEALTH_POLL = """
import http.client, sys, threading, time
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=60)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
longest, n = 0.0, 0
while n == 0 or not stop.is_set():
    t = time.monotonic()
    c.request("GET", "/health")
    r = c.getresponse()
    r.read()
    if r.status != 200:
        sys.exit(f"/health answered {r.status}")
    longest, n = max(longest, time.monotonic() - t), n + 1
    if n == 1:
        print("ready", flush=True)
    time.sleep(0.005)
print(n, longest)
"""


class HealthPoll:
    """GET /health over one connection, again and again, from a process of
    its own (so this one's GIL does not slow it): ``longest``, the longest
    answer while it ran (the server's event-loop stalls), and ``count``."""

    def __init__(self, port):
        self.port = port

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", HEALTH_POLL, str(self.port)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline() == "ready\n"
        return self

    def __exit__(self, *exc):
        out, _ = self.proc.communicate("", timeout=60)
        assert self.proc.returncode == 0, out
        n, longest = out.split()
        self.count, self.longest = int(n), float(longest)


def post(port, path, body, **kw):
    return request(port, "POST", path, body, **kw)


def sse(port, path, body):
    """Chunks of a streamed response (parsed), ending at [DONE]."""
    status, text = post(port, path, body)
    assert status == 200, text
    assert isinstance(text, str) and text.endswith("data: [DONE]\n\n")
    return [json.loads(x[6:]) for x in text.strip().split("\n\n") if x.startswith("data: {")]


def params(body, max_tokens=16):
    return intdet.SamplingParams(max_tokens=body.get("max_tokens", max_tokens), temperature=body.get("temperature", 1),
                                 top_p=body.get("top_p", 1), top_k=max(body.get("top_k", 0), 0), seed=body["seed"],
                                 stop=[body["stop"]] if isinstance(body.get("stop"), str) else body.get("stop", ()),
                                 logprobs=body.get("logprobs"))


BODIES = [
    {"prompt": "hello world", "max_tokens": 20, "temperature": 0, "seed": 0},
    {"prompt": [5, 17, 99, 230], "max_tokens": 30, "temperature": 0.8, "seed": 11, "top_k": 40},
    {"prompt": "a longer prompt " * 8, "max_tokens": 12, "temperature": 1.2, "seed": 5, "top_p": 0.9},
    {"prompt": "stop here", "max_tokens": 40, "temperature": 0, "seed": 0, "stop": ["zz", "ar "]},  # "ar " ends it
    {"prompt": "with logprobs", "max_tokens": 6, "temperature": 0.5, "seed": 3, "logprobs": 2},
]


def check_choice(llm, body, choice):
    want = llm.generate(body["prompt"], params(body))
    assert choice["text"] == want.text and choice["hash"] == want.hash and choice["seed"] == want.seed
    assert choice["finish_reason"] == {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}[
        want.finish_reason]
    if body.get("logprobs") is not None and "token_logprobs" in (choice.get("logprobs") or {}):
        assert choice["logprobs"]["token_logprobs"] == [t.logprob_q / 2**24 for t in want.logprobs]
    if want.finish_reason == "stop":  # vLLM's stop_reason: the stop string that matched, next in the text
        stops = params(body).stop
        free = llm.generate(body["prompt"], dataclasses.replace(params(body), stop=()))
        assert choice["stop_reason"] in stops and free.text.startswith(want.text + choice["stop_reason"]), choice
    elif "stop_reason" in choice:
        assert choice["stop_reason"] is None


def test_completions_equal_alone(server, llm):
    assert any(llm.generate(b["prompt"], params(b)).finish_reason == "stop" for b in BODIES)  # stop_reason is tested
    for body in BODIES:
        status, r = post(server, "/v1/completions", body)
        assert status == 200, r
        assert r["object"] == "text_completion" and r["system_fingerprint"] == llm.system_fingerprint
        check_choice(llm, body, r["choices"][0])
        assert r["usage"]["completion_tokens"] >= 1


def test_null_is_the_default(server, llm):
    """n, stream, echo (and chat's logprobs) sent as null, as OpenAI clients
    may: the defaults, the same completion as without them."""
    body = {"prompt": "The sky", "max_tokens": 4, "temperature": 0}
    status, want = post(server, "/v1/completions", body)
    assert status == 200, want
    status, r = post(server, "/v1/completions", {**body, "n": None, "stream": None, "echo": None, "logprobs": None,
                                                 "receipt": None, "return_token_ids": None})
    assert status == 200, r
    assert [c["text"] for c in r["choices"]] == [c["text"] for c in want["choices"]] and len(r["choices"]) == 1
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    status, want = post(server, "/v1/chat/completions", chat)
    status2, r = post(server, "/v1/chat/completions", {**chat, "n": None, "stream": None, "logprobs": None,
                                                       "receipt": None, "return_token_ids": None})
    assert (status, status2) == (200, 200) and r["choices"][0]["message"] == want["choices"][0]["message"], r
    assert post(server, "/v1/completions", {**body, "n": "2"})[0] == 400  # still strict about types


def test_many_concurrent_mixed_requests_each_equal_alone(server, llm):
    """24 clients at once, streaming and not, completions and chat; 8 of them
    the same greedy request: one distinct output."""
    jobs = [("c", dict(b)) for b in BODIES] + [("s", dict(b, stream=True)) for b in BODIES]
    same = {"prompt": "identical", "max_tokens": 24, "temperature": 0, "seed": 0}
    jobs += [("c" if i % 2 else "s", dict(same, stream=bool(i % 2 == 0))) for i in range(8)]
    chat = {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 10, "temperature": 0.7, "seed": 9}
    jobs += [("chat", dict(chat)), ("chat", dict(chat, stream=True))] * 3
    results = [None] * len(jobs)

    def run(i, kind, body):
        if kind == "chat":
            if body.get("stream"):
                chunks = sse(server, "/v1/chat/completions", body)
                last = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]][-1]["choices"][0]
                text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
                results[i] = (text, last["hash"])
            else:
                _, r = post(server, "/v1/chat/completions", body)
                results[i] = (r["choices"][0]["message"]["content"], r["choices"][0]["hash"])
        elif body.get("stream"):
            chunks = sse(server, "/v1/completions", body)
            last = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]][-1]["choices"][0]
            results[i] = ("".join(c["choices"][0]["text"] for c in chunks if c["choices"]), last["hash"])
        else:
            _, r = post(server, "/v1/completions", body)
            results[i] = (r["choices"][0]["text"], r["choices"][0]["hash"])

    ths = [threading.Thread(target=run, args=(i, k, b)) for i, (k, b) in enumerate(jobs)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(300)
    for (kind, body), res in zip(jobs, results):
        body = {k: v for k, v in body.items() if k != "stream"}
        if kind == "chat":
            want = llm.chat(body["messages"], intdet.SamplingParams(max_tokens=10, temperature=0.7, seed=9))
        else:
            want = llm.generate(body["prompt"], params(body))
        assert res == (want.text, want.hash), (kind, body)
    assert len({r for r, (k, b) in zip(results, jobs) if b.get("prompt") == "identical"}) == 1


def test_lm_eval_loglikelihood_request(server, llm):
    """lm-evaluation-harness local-completions, loglikelihood: its exact
    payload; it sums token_logprobs[ctxlen:-1] and calls a continuation
    greedy when each of its logprobs equals max(top_logprobs[i].values())
    (lm_eval/models/openai_completions.py parse_logprobs)."""
    ctx = llm.encode("the quick brown")
    cont = llm.encode(" fox jumps", add_bos=False)
    greedy = llm.generate(ctx, intdet.SamplingParams(max_tokens=3, temperature=0)).tokens
    pairs = [(ctx, cont), (ctx, greedy), (llm.encode("a"), [7])]
    body = {"model": "tiny", "prompt": [c + k for c, k in pairs], "max_tokens": 1, "logprobs": 1, "echo": True,
            "temperature": 0, "seed": 1234}
    status, r = post(server, "/v1/completions", body)
    assert status == 200, r
    choices = sorted(r["choices"], key=lambda c: c["index"])
    assert len(choices) == 3
    for ch, (c, k) in zip(choices, pairs):
        lp = ch["logprobs"]
        n = len(c) + len(k)
        assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["tokens"]) == n + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        ctxlen = len(c)
        total = sum(lp["token_logprobs"][ctxlen:-1])
        is_greedy = all(t == max(top.values()) for t, top in zip(lp["token_logprobs"][ctxlen:-1],
                                                               lp["top_logprobs"][ctxlen:-1]))
        s = llm.score(c, k)
        assert lp["token_logprobs"][ctxlen:-1] == [t.logprob for t in s.logprobs]
        assert total == pytest.approx(s.logprob, abs=1e-9) and is_greedy == s.is_greedy
    assert [s.is_greedy for s in llm.score(pairs)] == [False, True, llm.score(pairs[2][0], [7]).is_greedy]


def test_openai_client(server, llm):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key=KEY, max_retries=0)
    models = client.models.list()
    name = models.data[0].id
    r = client.completions.create(model=name, prompt="hello world", max_tokens=20, temperature=0, seed=0)
    want = llm.generate("hello world", intdet.SamplingParams(max_tokens=20))
    assert r.choices[0].text == want.text and r.choices[0].model_extra["hash"] == want.hash
    assert r.system_fingerprint == llm.system_fingerprint
    msgs = [{"role": "user", "content": "hi there"}]
    stream = client.chat.completions.create(model=name, messages=msgs, max_tokens=10, temperature=0.7, seed=9,
                                            stream=True, stream_options={"include_usage": True}, logprobs=True,
                                            top_logprobs=2)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    want = llm.chat(msgs, intdet.SamplingParams(max_tokens=10, temperature=0.7, seed=9, logprobs=2))
    assert text == want.text and chunks[-1].usage.completion_tokens == len(want.tokens)
    lps = [x.logprob for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.content]
    assert lps == [t.logprob for t in want.logprobs]
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=name, prompt="x", temperature=-1)
    bad = openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_seeds_drawn_returned_and_derived(server, llm):
    status, r = post(server, "/v1/completions", {"prompt": "seedless", "max_tokens": 8})
    seed = r["choices"][0]["seed"]
    again = llm.generate("seedless", intdet.SamplingParams(max_tokens=8, temperature=1, seed=seed))
    assert r["choices"][0]["hash"] == again.hash
    status, r = post(server, "/v1/completions", {"prompt": ["p one", "p two"], "max_tokens": 6, "n": 3,
                                                 "temperature": 1, "seed": 42})
    assert status == 200 and len(r["choices"]) == 6
    for ch in r["choices"]:
        p, c = divmod(ch["index"], 3)
        want = llm.generate(["p one", "p two"][p], intdet.SamplingParams(max_tokens=6, temperature=1,
                                                                         seed=intdet.derive_seed(42, c)))
        assert (ch["seed"], ch["hash"], ch["text"]) == (want.seed, want.hash, want.text)


def test_tokenize_detokenize_models_health(server, llm):
    status, r = post(server, "/tokenize", {"prompt": "hello world"})
    assert status == 200 and r["tokens"] == llm.encode("hello world") and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == llm.context_length
    status, r2 = post(server, "/detokenize", {"tokens": r["tokens"]})
    assert status == 200 and r2["prompt"] == llm.decode(r["tokens"])
    status, r = post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert r["tokens"] == llm.chat_ids([{"role": "user", "content": "hi"}])
    status, r3 = post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}],
                                           "add_generation_prompt": False})  # was ignored
    assert r3["tokens"] == llm.chat_ids([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert len(r3["tokens"]) < len(r["tokens"]) and r["tokens"][:len(r3["tokens"])] == r3["tokens"]
    assert request(server, "GET", "/health", key=None)[0] == 200
    status, r = request(server, "GET", "/v1/models")
    assert r["data"][0]["max_model_len"] == llm.context_length


def test_tokenize_and_detokenize_off_the_event_loop_and_bounded(model_dir, llm):
    """A MB of text is tokenized in a worker thread, by /tokenize and by the
    generation routes (/health answers in < 100 ms meanwhile); past the limits a 413 names the field (issue 52:
    7.8 MB blocked every request for 5 s)."""
    proc, port = start_server(model_dir)  # the default body limit, 8 MiB
    try:
        limit = 1 << 20
        words = ["".join(chr(97 + (i * 7 + j) % 26) for j in range(1 + i % 9)) for i in range(200_000)]
        text = " ".join(words)[:limit]
        with HealthPoll(port) as health:
            status, r = post(port, "/tokenize", {"prompt": text})
        assert status == 200 and r["tokens"] == llm.encode(text), status
        assert health.count >= 3 and health.longest < 0.1, (health.count, health.longest)
        ids = r["tokens"][: 1 << 18]
        with HealthPoll(port) as health:
            status, r = post(port, "/detokenize", {"tokens": ids})
        assert status == 200 and r["prompt"] == llm.decode(ids)
        assert health.longest < 0.1, health.longest
        # the generation routes tokenize off the loop too (a MB is past the context: a 400 after encoding)
        for path, body in (("/v1/completions", {"prompt": text}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]})):
            with HealthPoll(port) as health:
                status, r = post(port, path, body)
            assert status == 400 and "context" in r["error"]["message"], (path, status, r)
            assert health.count >= 3 and health.longest < 0.1, (path, health.count, health.longest)

        status, r = post(port, "/tokenize", {"prompt": text + "é"})
        assert status == 413 and r["error"]["param"] == "prompt", r
        assert r["error"]["message"] == f"prompt: {limit + 2} bytes of text is more than this server's limit of " \
                                        f"{limit} for /tokenize"
        half = {"role": "user", "content": text[: limit // 2 + 1]}
        status, r = post(port, "/tokenize", {"messages": [half, half]})
        assert status == 413 and r["error"]["param"] == "messages", r
        status, r = post(port, "/detokenize", {"tokens": [1] * ((1 << 18) + 1)})
        assert status == 413 and r["error"]["param"] == "tokens" and "262145 ids" in r["error"]["message"], r
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def test_llguidance_tokenizer_is_built_before_serving(model_dir):
    """Its build holds the GIL (~0.5 s for SmolLM2's 49k ids): done when the
    app is made, not at the first structured request on the event loop."""
    from intdet import structured
    from intdet.serve.app import create_app

    llm = intdet.load(model_dir, threads=1)  # a tokenizer object of its own
    key = (id(llm.tokenizer), tuple(llm.eos_ids))
    assert key not in structured._TOKENIZERS
    create_app(llm, "tiny")
    assert structured._TOKENIZERS[key][0] is llm.tokenizer


def test_api_key_on_every_endpoint_but_health(server):
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                         ("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/stats"), ("GET", "/metrics"),
                         ("GET", "/nope")):
        for key in (None, "wrong", KEY + "x"):
            status, r = request(server, method, path, {"prompt": "x"}, key=key)
            assert status == 401 and r["error"]["type"] == "authentication_error", (method, path, key)
    assert request(server, "GET", "/health", key=None)[0] == 200


HOSTILE = [
    (b"{not json", 400, "not valid JSON"),
    (b"", 400, "not valid JSON"),
    (b"[1, 2]", 400, "must be a JSON object"),
    (b'{"prompt": "x", "max_tokens": NaN}', 400, "not valid JSON"),
    (b'{"prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}", 400, "not valid JSON"),
    ({"prompt": 5}, 400, "prompt: must be a string"),
    ({"prompt": [1, "a"]}, 400, "prompt: must be"),
    ({"prompt": []}, 400, "prompt: empty"),
    ({"prompt": ""}, 400, "prompt: empty"),
    ({"prompt": [[]]}, 400, "prompt: empty"),
    ({"prompt": [5, 100000]}, 400, "outside the vocabulary"),
    ({"prompt": [-1]}, 400, "prompt: token id -1 is outside the vocabulary [0, "),
    ({"prompt": [[5], [2**80]]}, 400, "prompt[1]: token id 1208925819614629174706176 is outside the vocabulary"),
    (b'{"prompt": "\\ud800"}', 400, "prompt: character 0 is a lone surrogate (U+D800)"),
    (b'{"prompt": ["ok", "a \\udfff"]}', 400, "prompt[1]: character 2 is a lone surrogate (U+DFFF)"),
    ({}, 400, "prompt: Field required"),
    ({"prompt": "x", "max_tokens": "10"}, 400, "max_tokens: Input should be a valid integer"),
    ({"prompt": "x", "max_tokens": 10**30}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 1.5}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 300}, 400, "max_tokens: this model's maximum context length is 256"),
    ({"prompt": [5] * 300, "max_tokens": 1}, 400, "maximum context length"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature: must be a number"),
    ({"prompt": "x", "temperature": "0.5"}, 400, "temperature: must be a number (got '0.5')"),
    ({"prompt": "x", "temperature": 1e308}, 400, "temperature"),
    ({"prompt": "x", "temperature": True}, 400, "temperature"),
    ({"prompt": "x", "temperature": 0.1234567}, 400, "more than 6 decimal places"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "seed": 2**70}, 400, "seed"),
    ({"prompt": "x", "seed": -5}, 400, "seed"),
    ({"prompt": "x", "n": 10**9}, 400, "n: 1000000000 is more than this server's limit of 4"),
    ({"prompt": "x", "n": 0}, 400, "n"),
    ({"prompt": "x", "logprobs": 10**6}, 400, "logprobs"),
    ({"prompt": "x", "stop": [1]}, 400, "stop"),
    ({"prompt": "x", "stop": ["s"] * 40}, 400, "stop: at most 16"),
    ({"prompt": "x", "frobnicate": 1}, 400, "frobnicate: unknown field"),
    ({"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty: not supported (only 0 or null)"),
    ({"prompt": "x", "logit_bias": {"5": 10}}, 400, "logit_bias: not supported (only {} or null)"),
    ({"prompt": "x", "suffix": "y"}, 400, 'suffix: not supported (only "" or null)'),
    ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": "s"}}}, 400,
     "response_format.json_schema.schema: Input should be a valid dictionary"),  # no "dict[any,any]" in the path
    ({"prompt": "x", "best_of": 3}, 400, "best_of"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model: 'gpt-4' is not served here"),
    ({"prompt": "x", "stream_options": {"include_usage": "yes"}}, 400, "stream_options.include_usage"),
    ({"prompt": ["a"] * 300}, 400, "more than 256 prompts"),
]


@pytest.mark.parametrize("body,status,msg", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_hostile_completions(server, body, status, msg):
    raw = body if isinstance(body, bytes) else None
    got, r = post(server, "/v1/completions", None if raw is not None else body, raw=raw)
    assert got == status, r
    assert set(r) == {"error"} and msg in r["error"]["message"] and "\n" not in r["error"]["message"]
    assert "Traceback" not in json.dumps(r)


@pytest.mark.parametrize("body,msg", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": 5}]}, "content: must be"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}, "maximum context length"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 99, "logprobs": True}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, "top_logprobs: needs \"logprobs\": true"),
    ({"messages": [{"role": "user", "content": "x" * 2000}]}, "maximum context length"),
    ({"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "\ud800"}]},
     "messages[1].content: character 0 is a lone surrogate"),
])
def test_hostile_chat(server, body, msg):
    status, r = post(server, "/v1/chat/completions", body)
    assert status == 400 and msg in r["error"]["message"], r


def test_hostile_other_endpoints(server):
    assert post(server, "/detokenize", {"tokens": [10**6]})[0] == 400
    assert post(server, "/detokenize", {"tokens": "abc"})[0] == 400
    assert post(server, "/tokenize", {})[0] == 400
    status, r = post(server, "/tokenize", {"prompt": "a\ud800"})
    assert status == 400 and r["error"]["message"] == "prompt: character 1 is a lone surrogate (U+D800), not text"
    assert request(server, "GET", "/v1/completions")[0] == 405
    status, r = post(server, "/v1/completions", None, raw=b"x" * (1 << 20 + 1) + b"x" * 10)
    assert status == 413 and "larger than" in r["error"]["message"]
    # a Content-Length that lies about a huge body is refused before reading
    status, r = post(server, "/v1/completions", None, raw=b"{}", headers={"Content-Length": str(10**12)})
    assert status in (400, 413)
    assert request(server, "GET", "/health", key=None)[0] == 200


def stats(port):
    return request(port, "GET", "/stats")[1]


def wait_idle(port, cancelled_before, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = stats(port)
        if s["running"] == 0 and s["waiting"] == 0 and s["cancelled"] > cancelled_before:
            return s
        time.sleep(0.05)
    raise AssertionError(f"not idle: {stats(port)}")


@pytest.mark.parametrize("stream", [True, False])
def test_client_vanishing_frees_its_slot(server, llm, stream):
    before = stats(server)["cancelled"]
    # 16 sequences of 250 tokens on 4 slots: still running when the client leaves
    body = json.dumps({"prompt": ["x", "y", "z", "w"], "n": 4, "max_tokens": 250, "temperature": 0,
                       "stream": stream}).encode()
    s = socket.create_connection(("127.0.0.1", server))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    if stream:
        assert s.recv(100).startswith(b"HTTP/1.1 200")  # the stream has begun
    else:
        # long enough for the server to admit the request (loopback: ms), short
        # against the 16 x 250 tokens (about 0.2 s on a fast CPU)
        time.sleep(0.02)
    s.close()
    after = wait_idle(server, before)
    assert after["kv_used_bytes"] == 0
    # the engine still serves, with the same bits
    status, r = post(server, "/v1/completions", BODIES[0])
    assert status == 200 and r["choices"][0]["hash"] == llm.generate(BODIES[0]["prompt"], params(BODIES[0])).hash


def test_sigterm_drains_running_streams(model_dir):
    proc, port = start_server(model_dir, "--drain-timeout", "120", key=None)
    out = {}

    def client():
        try:
            out["chunks"] = sse(port, "/v1/completions", {"prompt": "drain me", "max_tokens": 240, "temperature": 0,
                                                          "stream": True})
        except Exception as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=client)
    t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and t.is_alive() and stats_open(port)["running"] == 0:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert proc.wait(60) == 0
    assert "error" not in out and out["chunks"][-1]["choices"][0]["finish_reason"] in ("length", "stop")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_drain_timeout_ends_requests_whole(model_dir):
    """Requests still running when --drain-timeout runs out end as whole
    responses (a JSON body, a stream's last chunk and [DONE]), with nothing
    logged but uvicorn's own lines: no traceback."""
    proc, port = start_server(model_dir, "--drain-timeout", "1", "--max-batch", "1", "--max-n", "16", key=None)
    out = {}
    body = {"prompt": "drain me", "max_tokens": 240, "temperature": 0, "n": 16}

    def streamed(k):
        try:
            out[k] = sse(port, "/v1/completions", dict(body, stream=True))
        except Exception as e:  # noqa: BLE001
            out[k] = e

    def plain(k):
        try:
            out[k] = request(port, "POST", "/v1/completions", body, key=None)
        except Exception as e:  # noqa: BLE001
            out[k] = e

    # one slot for 8 x 16 sequences of 240 tokens (about 30,000 steps, 7 s
    # on this project's 2-core machines): far more than the 1 s drain
    ts = [threading.Thread(target=f, args=(k,)) for k, f in enumerate([streamed, plain] * 4)]
    for t in ts:
        t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and stats_open(port)["requests"] < 8 * 16:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    for t in ts:
        t.join(60)
    assert proc.wait(60) == 0
    finishes = []
    for k, r in out.items():
        assert not isinstance(r, Exception), (k, r)
        if k % 2 == 0:  # streamed: every chunk parsed, a last chunk per choice names its finish
            ends = [c["choices"][0]["finish_reason"] for c in r if c["choices"] and c["choices"][0]["finish_reason"]]
            assert len(ends) == 16, r[-3:]
            finishes += ends
        else:
            status, b = r
            assert status == 200 and len(b["choices"]) == 16, b
            finishes += [c["finish_reason"] for c in b["choices"]]
    assert set(finishes) <= {"length", "stop", "abort"} and "abort" in finishes, finishes
    log = "".join(proc.log)
    assert "Traceback" not in log and "never retrieved" not in log, log


def test_drain_outlasted_by_a_step_ends_every_response_whole(model_dir, llm):
    """The engine's step in flight never returns (a test hook stalls its 6th
    forward call for an hour: a long prefill on a slow machine): at
    --drain-timeout every running or waiting choice still ends as a whole
    response, finish_reason "abort", holding the tokens its client received
    and their chain hash (the hash of generating just those tokens), and the
    server exits 0 without waiting for the step; no traceback. Each
    receipt (the tokens received) replays."""
    from intdet.receipts import replay

    proc, port = start_server(model_dir, "--drain-timeout", "1", "--max-batch", "16", "--step-tokens", "8",
                              key=None, env={"INTDET_TEST_STALL_AT": "engine-step-6"})
    out = {}
    prompts = [f"prompt number {k} " * (1 + k % 3) for k in range(12)]

    def one(k):
        body = {"max_tokens": 150, "temperature": 0, "seed": 0, "receipt": True}
        chat = k % 4 >= 2
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body.update({"messages": [{"role": "user", "content": prompts[k]}]} if chat else {"prompt": prompts[k]})
        try:
            if k % 2 == 0:
                out[k] = sse(port, path, dict(body, stream=True, stream_options={"include_usage": True}))
            else:
                out[k] = post(port, path, body, key=None)
        except Exception as e:  # noqa: BLE001
            out[k] = e

    ts = [threading.Thread(target=one, args=(k,)) for k in range(12)]
    for t in ts:
        t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and stats_open(port)["requests"] < 12:
        time.sleep(0.02)
    assert stats_open(port)["steps"] == 5  # stalled in the 6th step, every request submitted
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    for t in ts:
        t.join(30)
    assert proc.wait(30) == 0 and time.monotonic() - t0 < 20
    for k in range(12):
        r = out[k]
        assert not isinstance(r, Exception), (k, r)
        chat = k % 4 >= 2
        if k % 2 == 0:
            ends = [c["choices"][0] for c in r if c["choices"] and c["choices"][0]["finish_reason"]]
            assert len(ends) == 1 and ends[0]["finish_reason"] == "abort", r[-3:]
            text = "".join((c["choices"][0]["delta"].get("content") or "") if chat else c["choices"][0]["text"]
                           for c in r if c["choices"])
            n_out, got_hash, receipt = r[-1]["usage"]["completion_tokens"], ends[0]["hash"], ends[0]["receipt"]
        else:
            status, b = r
            assert status == 200, b
            c = b["choices"][0]
            assert c["finish_reason"] == "abort", c
            text = c["message"]["content"] if chat else c["text"]
            n_out, got_hash, receipt = b["usage"]["completion_tokens"], c["hash"], c["receipt"]
        sp = intdet.SamplingParams(max_tokens=n_out, temperature=0, seed=0)
        want = (llm.chat([{"role": "user", "content": prompts[k]}], sp) if chat else llm.generate(prompts[k], sp))
        assert got_hash == want.hash and want.text.startswith(text), (k, n_out, text, want.text)
        # its receipt (the tokens received, finish_reason "cancelled") replays as intdet verify does
        assert receipt["finish_reason"] == "cancelled" and len(receipt["output_ids"]) == n_out
        assert receipt["chain_hash"].startswith(got_hash)
        verdict, = replay(llm, [(f"response {k}", receipt)])
        assert verdict.ok, verdict.line()
    log = "".join(proc.log)
    assert "Traceback" not in log and "never retrieved" not in log, log
    assert "ended with finish_reason \"abort\"" in log, log


def test_disconnect_while_waiting_logs_nothing(model_dir):
    """A client that leaves a non-streamed request cancels it quietly (the
    gathered wait's CancelledError is retrieved, not logged)."""
    # one slot for 16 sequences of 250 tokens: still running when the client leaves
    proc, port = start_server(model_dir, "--max-batch", "1", key=None)
    try:
        body = json.dumps({"prompt": ["x", "y", "z", "w"], "n": 4, "max_tokens": 250, "temperature": 0}).encode()
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not stats_open(port)["running"]:  # admitted
                time.sleep(0.005)
            s.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (stats_open(port)["running"] or stats_open(port)["waiting"]):
            time.sleep(0.02)
        assert stats_open(port)["cancelled"] >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    log = "".join(proc.log)
    assert "Traceback" not in log and "never retrieved" not in log, log


def stats_open(port):
    return request(port, "GET", "/stats", key=None)[1]


def test_bad_serve_options(model_dir):
    for args, msg in ((["--port", "70000"], "--port: 70000 must be <= 65535"), (["--max-batch", "0"], "--max-batch"),
                      (["--idle-timeout", "0"], "--idle-timeout: 0 must be >= 1"),
                      (["--host", "256.0.0.1"], "cannot bind")):
        r = subprocess.run([sys.executable, "-m", "intdet", "serve", "-m", model_dir, *args], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 1 and r.stderr.startswith("intdet: error: ") and msg in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def test_connection_limit_answers_503(model_dir):
    proc, port = start_server(model_dir, "--max-connections", "2", "--max-batch", "1", key=None)
    try:
        body = json.dumps({"prompt": ["x", "y"], "n": 4, "max_tokens": 240, "temperature": 0, "stream": True}).encode()
        held = []
        for _ in range(2):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            assert s.recv(100).startswith(b"HTTP/1.1 200")
            held.append(s)
        status, r = request(port, "GET", "/v1/models", key=None)
        assert status == 503 and set(r) == {"error"} and "--max-connections" in r["error"]["message"], r
        for s in held:
            s.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if request(port, "GET", "/health", key=None)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        assert request(port, "GET", "/health", key=None)[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_idle_connections_are_closed(model_dir):
    """Sockets that connect and send nothing are closed after --idle-timeout,
    so they cannot hold the connection slots (uvicorn alone kept them)."""
    proc, port = start_server(model_dir, "--max-connections", "2", "--idle-timeout", "1", key=None)
    try:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        t0 = time.monotonic()
        for s in idle:
            s.settimeout(30)
            assert s.recv(100) == b""  # closed by the server
        assert time.monotonic() - t0 < 20
        assert request(port, "GET", "/health", key=None)[0] == 200
        # a connection that sends its request in time is served as before
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(30)
        assert s.recv(100).startswith(b"HTTP/1.1 200")
        s.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_streamed_logprobs_and_offsets(server, llm):
    body = {"prompt": "with logprobs", "max_tokens": 12, "temperature": 0.5, "seed": 3, "logprobs": 2, "stream": True}
    chunks = sse(server, "/v1/completions", body)
    want = llm.generate(body["prompt"], params(body))
    lps = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    assert [x["token_logprobs"][0] for x in lps] == [t.logprob for t in want.logprobs]
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert "".join(texts) == want.text
    offsets = [x["text_offset"][0] for x in lps]
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert all(len(x["top_logprobs"][0]) >= 2 for x in lps)


def test_mailbox_one_wakeup_per_batch_and_order_kept():
    """Events posted from another thread while the loop is busy arrive in
    order, per queue, after a single wake-up of the loop (serve.app.Mailbox)."""
    import asyncio

    from intdet.serve.app import Mailbox

    loop = asyncio.new_event_loop()
    try:
        box = Mailbox(loop)
        drains = []
        real = box._drain
        box._drain = lambda: (drains.append(1), real())
        queues = [asyncio.Queue() for _ in range(3)]
        t = threading.Thread(target=lambda: [box.post(queues[i % 3], i) for i in range(30)])
        t.start()
        t.join()  # all 30 posted before the loop runs a callback

        async def collect():
            return [[await q.get() for _ in range(10)] for q in queues]

        got = loop.run_until_complete(collect())
        assert got == [list(range(k, 30, 3)) for k in range(3)]
        assert len(drains) == 1
        box.post(queues[0], "late")  # after a drain, the next post wakes the loop again
        assert loop.run_until_complete(queues[0].get()) == "late" and len(drains) == 2
    finally:
        loop.close()


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "top_p": 2}, "top_p"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "logprobs": 10**6}, "logprobs"),
    ({"prompt": [[1, 2, 10**9]]}, "prompt"),
])
def test_error_param_is_the_field(server, body, param):
    """The OpenAI error's param comes from IntdetError.field (not from
    parsing the message)."""
    got, r = post(server, "/v1/completions", body)
    assert got == 400 and r["error"]["param"] == param, r


def test_prefix_cache_server(model_dir):
    """The prefix cache is on by default (--no-prefix-cache turns it off);
    with --spec-ngram, a few-shot prompt sent twice gives the same choices
    with and without the cache, those of the API without either; with it
    the second request reports cached prompt tokens in usage and /stats
    counts the hit and the drafts, without it neither exists."""
    prompt = "Q: the cat sat on the mat. A: the mat. " * 6 + "Q: the dog sat on the log. A:"
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "seed": 1}
    cold = intdet.load(model_dir, threads=1, prefix_cache=False)
    assert cold.scheduler.cache is None
    want = cold.generate(prompt, params(body))
    for flags, cache in (((), True), (("--no-prefix-cache",), False)):
        proc, port = start_server(model_dir, *flags, "--spec-ngram", "4")
        try:
            outs = [post(port, "/v1/completions", body) for _ in range(2)]
            for status, r in outs:
                assert status == 200 and r["choices"][0]["hash"] == want.hash and r["choices"][0]["text"] == want.text
            status, st = request(port, "GET", "/stats")
            assert status == 200 and st["spec_drafted_tokens"] >= st["spec_accepted_tokens"] >= 0
            if cache:
                assert outs[0][1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
                cached = outs[1][1]["usage"]["prompt_tokens_details"]["cached_tokens"]
                assert 16 <= cached < outs[1][1]["usage"]["prompt_tokens"]
                assert st["prefix_cache"]["hits"] == 1 and st["prefix_cache"]["hit_tokens"] == cached
            else:
                assert all("prompt_tokens_details" not in r["usage"] for _, r in outs) and "prefix_cache" not in st
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
