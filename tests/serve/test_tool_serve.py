"""Tool calling against ``intdet serve`` with the openai SDK, on the tiny
family checkpoints with their real chat templates (tests/models/
test_family_chat.py's, plus the tool tags their vocabularies hold and a
longer context for the tool prompts): tool_choice required, named, auto and
none, a tool result fed back, streaming; every response equal to the Python
API's ``LLM.chat`` (chain hash, content, calls); ``intdet chat --tools``;
developer messages and the SDK's neutral fields; the errors naming their
field; the same bytes at 8 clients as at 1."""

import json
import os
import signal
import subprocess
import sys

import pytest

import intdet
from intdet.convert import convert
from intdet.errors import IntdetError

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")
pytest.importorskip("transformers")

from test_family_chat import run_cli, write_chat_family  # noqa: E402
from test_serve import KEY, post, start_server  # noqa: E402

# the tool tags each family's real vocabulary has as special tokens (Qwen's <tool_call> is an added token)
TAGS = {"llama3": ["<|python_tag|>", "<|eom_id|>"], "llama3.2": ["<|python_tag|>", "<|eom_id|>"],
        "mistral": ["[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
        "qwen2": ["<tool_call>", "</tool_call>"], "qwen3": ["<tool_call>", "</tool_call>"],
        "granite": ["<|tool_call|>"], "smollm3": []}
CASES = ["llama3", "mistral", "qwen2", "qwen3", "granite"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                                  "required": ["a"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MSGS = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "What is the weather in Paris?"}]
NEUTRAL = {"store": False, "metadata": {"run": "test"}, "service_tier": "auto", "user": "u1",
           "prompt_cache_key": "k", "safety_identifier": "s"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = {}

    def get(case):
        if case not in cache:
            d = tmp_path_factory.mktemp(case.replace(".", "_"))
            hf = write_chat_family(case, str(d / "hf"), TAGS[case], max_position_embeddings=2048)
            cache[case] = convert(hf, str(d / "int"), progress=False)
        return cache[case]

    return get


@pytest.fixture(scope="module")
def serve(built):
    procs = {}

    def get(case):
        if case not in procs:
            procs[case] = start_server(built(case), "--max-batch", "8")
        return procs[case][1]

    yield get
    for proc, _ in procs.values():
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


@pytest.fixture(scope="module")
def llms(built):
    cache = {}

    def get(case):
        if case not in cache:
            cache[case] = intdet.load(built(case), threads=1)
        return cache[case]

    return get


def client(port):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)


def check_calls(calls, name=None, one=True):
    assert calls and (len(calls) == 1 or not one)
    for c in calls:
        assert c.type == "function" and c.id and (name is None or c.function.name == name)
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def same_as_api(llm, choice, msgs, params, **tools):
    """The server's choice equals LLM.chat's completion of the same request."""
    c = llm.chat(msgs, params, **tools)
    assert choice.model_extra["hash"] == c.hash
    assert choice.message.content == (c.text if c.text or not c.tool_calls else None)
    assert [t.model_dump() for t in choice.message.tool_calls or []] == (c.tool_calls or [])
    assert choice.finish_reason == {"eos": "stop"}.get(c.finish_reason, c.finish_reason)
    return c


def streamed(cl, **body):
    """(content, tool_calls as dicts, finish_reason, hash) of a streamed response, deltas accumulated by index."""
    content, calls, finish, h = "", {}, None, None
    for chunk in cl.chat.completions.create(stream=True, **body):
        for ch in chunk.choices:
            d = ch.delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                acc = calls.setdefault(tc.index, {"id": None, "type": "function",
                                                  "function": {"name": None, "arguments": ""}})
                if tc.id:
                    acc["id"] = tc.id
                if tc.function and tc.function.name:
                    acc["function"]["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    acc["function"]["arguments"] += tc.function.arguments
            if ch.finish_reason:
                finish, h = ch.finish_reason, ch.model_extra.get("hash")
    return content, [calls[i] for i in sorted(calls)], finish, h


@pytest.mark.parametrize("case", CASES)
def test_sdk_tool_flow(serve, llms, case):
    """required, named, streamed, fed back, auto and none, through the SDK;
    each equal to the Python API's answer."""
    cl, llm = client(serve(case)), llms(case)
    base = dict(model="", messages=MSGS, tools=TOOLS, max_tokens=120, temperature=0.8, seed=5, **NEUTRAL)
    p = intdet.SamplingParams(max_tokens=120, temperature=0.8, seed=5)
    r = cl.chat.completions.create(tool_choice="required", parallel_tool_calls=False, **base)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    check_calls(ch.message.tool_calls)
    same_as_api(llm, ch, MSGS, p, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    if case == "mistral":  # its template takes 9-character ids only
        assert len(ch.message.tool_calls[0].id) == 9

    named = {"type": "function", "function": {"name": "add"}}
    rn = cl.chat.completions.create(tool_choice=named, **base)
    check_calls(rn.choices[0].message.tool_calls, "add")
    same_as_api(llm, rn.choices[0], MSGS, p, tools=TOOLS, tool_choice=named)

    # streamed: the same calls, ids and hash as the whole response
    content, calls, finish, h = streamed(cl, tool_choice="required", parallel_tool_calls=False, **base)
    assert (content, calls, finish, h) == ("", [t.model_dump() for t in ch.message.tool_calls], "tool_calls",
                                          ch.model_extra["hash"])

    # the call and its result fed back (the SDK's own message object), then auto and none
    hist = MSGS + [ch.message] + [{"role": "tool", "tool_call_id": t.id, "content": "sunny, 21 C"}
                                  for t in ch.message.tool_calls]
    hist_dicts = MSGS + [ch.message.model_dump(exclude_none=True)] + hist[len(MSGS) + 1:]
    for choice in ("auto", "none"):
        body = dict(base, messages=hist, max_tokens=24, temperature=0, seed=0)
        r2 = cl.chat.completions.create(tool_choice=choice, **body)
        c2 = same_as_api(llm, r2.choices[0], hist_dicts, intdet.SamplingParams(max_tokens=24, seed=0), tools=TOOLS,
                         tool_choice=choice)
        if choice == "auto":  # streamed auto: the same content, calls and hash
            s = streamed(cl, tool_choice="auto", **body)
            assert s == (r2.choices[0].message.content or "", c2.tool_calls or [], r2.choices[0].finish_reason, c2.hash)
        else:
            assert r2.choices[0].message.tool_calls is None
    # the conversation's prompt holds the call (Granite's template drops tool_calls: intdet writes them)
    ids = llm.chat_ids(hist_dicts, TOOLS)
    text = llm.decode(ids, skip_special_tokens=False)
    name = ch.message.tool_calls[0].function.name
    assert text.count(f'"{name}"') >= 2 and "sunny, 21 C" in text  # the tool list and the call
    if case == "granite":
        tag = llm.tokenizer.token_to_id("<|tool_call|>")
        assert ids.count(tag) == 1  # the call's tag as the control token


def test_parallel_calls_and_errors(serve):
    port = serve("qwen2")
    cl = client(port)
    # parallel (Hermes): one or more calls, each valid
    r = cl.chat.completions.create(model="", messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=200,
                                   temperature=0.8, seed=2)
    if r.choices[0].finish_reason == "tool_calls":
        check_calls(r.choices[0].message.tool_calls, one=False)
    good = {"messages": MSGS, "tools": TOOLS, "max_tokens": 4, "seed": 0}
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "(("}}}}}
    cases = [
        ({"tools": [WEATHER, bad_tool]}, "tools[1].function.parameters", "unclosed group"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name", "nope"),
        ({"tool_choice": "always"}, "tool_choice", "tool_choice"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice", "cannot be combined"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "tool_call_id"),
        ({"messages": MSGS + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "abc", "type": "function", "function": {"name": "add", "arguments": "{oops"}}]}]},
         "messages", "messages[2].tool_calls[0].function.arguments: not valid JSON"),
        ({"frobnicate": 1}, "frobnicate", "frobnicate: unknown field"),
    ]
    for change, param, needle in cases:
        status, body = post(port, "/v1/chat/completions", {**good, **change})
        assert status == 400, (change, body)
        assert body["error"]["param"] == param and needle in body["error"]["message"], (change, body)
        assert "\n" not in body["error"]["message"]
    # neutral fields and parallel_tool_calls without tools are accepted; developer is a system message
    status, body = post(port, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 3, "seed": 0,
                                                       "parallel_tool_calls": True, **NEUTRAL})
    assert status == 200, body
    status, tok = post(port, "/tokenize", {"messages": MSGS})
    status2, tok2 = post(port, "/tokenize", {"messages": [dict(MSGS[0], role="system"), MSGS[1]]})
    assert status == status2 == 200 and tok["tokens"] == tok2["tokens"]


def test_template_without_tools_is_refused(built, tmp_path):
    """SmolLM3's template (the llama.cpp copy) renders no tools: a one-line
    error naming tools, in the API and the CLI."""
    llm = intdet.load(built("smollm3"), threads=1)
    with pytest.raises(IntdetError, match="no tool-calling format") as e:
        llm.chat(MSGS, tools=TOOLS)
    assert e.value.field == "tools"
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    r = run_cli(["chat", "-m", built("smollm3"), "--tools", tools, "-n", 2], tmp_path, stdin="hi\n")
    assert r.returncode == 1 and r.stderr.startswith(f"intdet: error: --tools {tools}: this model's chat template")


def test_cli_chat_tools(built, serve, tmp_path):
    """intdet chat --tools: the calls printed as JSON lines, /tool answers,
    and both replies equal the server's (chain hash)."""
    conv, port = built("qwen2"), serve("qwen2")
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    r = run_cli(["chat", "-m", conv, "--tools", tools, "--tool-choice", "add", "-n", 80, "--temperature", 0],
                tmp_path, stdin="What is 2+2?\n/tool 4\n")
    assert r.returncode == 0, r.stderr
    calls = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    named = {"type": "function", "function": {"name": "add"}}
    status, s = post(port, "/v1/chat/completions", {"messages": msgs, "tools": TOOLS, "tool_choice": named,
                                                    "max_tokens": 80, "temperature": 0, "seed": 0})
    assert status == 200 and s["choices"][0]["message"]["tool_calls"] == calls[:1]
    hist = msgs + [s["choices"][0]["message"], {"role": "tool", "tool_call_id": calls[0]["id"], "content": "4"}]
    status, s2 = post(port, "/v1/chat/completions", {"messages": hist, "tools": TOOLS, "tool_choice": named,
                                                     "max_tokens": 80, "temperature": 0, "seed": 0})
    assert status == 200 and s2["choices"][0]["message"]["tool_calls"] == calls[1:]  # named: a call again
    hashes = [ln.rsplit("hash ", 1)[1] for ln in r.stderr.splitlines() if "hash " in ln]
    assert hashes == [s["choices"][0]["hash"], s2["choices"][0]["hash"]]
    bad = run_cli(["chat", "-m", conv, "--tool-choice", "required", "-n", 2], tmp_path, stdin="hi\n")
    assert bad.returncode == 1 and "--tool-choice: needs --tools" in bad.stderr


def test_same_bytes_at_8_clients(built, serve):
    """scripts/tool_calls_concurrency.py with a small N: every response
    (ids and timestamps aside) the same at 8 clients as at 1."""
    from conftest import load_script

    script = load_script("tool_calls_concurrency")
    port = serve("qwen2")
    bodies = script.bodies(24, seed=1)
    one = script.run(f"http://127.0.0.1:{port}", bodies, 1, KEY)
    eight = script.run(f"http://127.0.0.1:{port}", bodies, 8, KEY)
    assert one == eight
    assert sum(b'"tool_calls"' in x for x in one) >= 8  # the run holds calls, whole and streamed


def test_script_runs(built):
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "tool_calls_concurrency.py")
    r = subprocess.run([sys.executable, script, "-m", built("qwen2"), "-n", "8", "--clients", "4"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["same"] is True and out["requests"] == 8
