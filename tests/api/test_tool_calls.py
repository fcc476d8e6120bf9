"""tool_calls.py without a model: each format detected from the real chat
templates (tests/data/chat_templates), parsed (valid calls, text that is not
a call, unknown names), the forced grammar walked at random over the tiny
tokenizer (tags as text and as special tokens) always parsing, the request
checks naming their field, OpenAI messages as the templates read them, the
streaming parser agreeing with the whole-text one, and special-token
strings inside tools staying text."""

import json
from pathlib import Path

import numpy as np
import pytest

from intdet.errors import IntdetError
from intdet.random_model import make_tokenizer
from intdet.structured import Grammar, StructuredOutputsParams
from intdet.tool_calls import (FORMATS, START, CallParser, ToolSetup, detect_format, grammar_text, parse, parse_reply,
                               render_calls, renders_tool_calls, setup, special_ids, template_messages)

pytest.importorskip("llguidance")

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                                                    "b": {"type": "integer", "minimum": 0, "maximum": 9}},
                                  "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
NAMES = ["get_weather", "add"]
TAGS = ["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|tool_call|>", "<|python_tag|>"]


@pytest.mark.parametrize("name,fmt", [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "hermes"), ("Qwen-Qwen3-0.6B.jinja", "hermes"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral"),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", "granite"),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3_json"), ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3_json"),
    ("HuggingFaceTB-SmolLM3-3B.jinja", None), ("google-gemma-2-2b-it.jinja", None),
    ("microsoft-Phi-3.5-mini-instruct.jinja", None), ("mistralai-Mixtral-8x7B-Instruct-v0.1.jinja", None)])
def test_detect_format(name, fmt):
    src = (TEMPLATES / name).read_text(encoding="utf-8")
    assert detect_format(src) == fmt
    if fmt is not None:  # Granite 3.3's template drops an assistant message's tool_calls; the others write them
        assert renders_tool_calls(src, "<s>", "</s>") == (fmt != "granite")


CALLS = [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]


@pytest.mark.parametrize("fmt", FORMATS)
def test_parse_round_trip(fmt):
    calls = CALLS[:1] if fmt == "llama3_json" else CALLS
    objs = [{"function": {"name": n, "arguments": a}} for n, a in calls]
    text = render_calls(fmt, objs)
    assert parse(fmt, text, NAMES) == ("", calls)
    if fmt != "llama3_json":  # text before the calls is content
        assert parse(fmt, "Let me check.\n" + text, NAMES) == ("Let me check.\n", calls)
    # not a call: the whole text stays content
    for bad in (text.replace("get_weather", "nope"), text[:-3], text + " and more {", "just words"):
        assert parse(fmt, bad, NAMES) == (bad, []), bad


def test_parse_format_details():
    assert parse("llama3_json", '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}<|eom_id|>', NAMES) \
        == ("", [("add", {"a": 1, "b": 2})])
    assert parse("llama3_json", ' {"name": "add", "arguments": {"a": 1, "b": 2}}', NAMES)[1] == [("add", {"a": 1, "b": 2})]
    # arguments written as a JSON string are read too; an argument that is not an object is not a call
    assert parse("hermes", '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1}"}\n</tool_call>', NAMES)[1] \
        == [("add", {"a": 1})]
    t = '<tool_call>\n{"name": "add", "arguments": 5}\n</tool_call>'
    assert parse("hermes", t, NAMES) == (t, [])
    # an unterminated last block (the reply cut at </tool_call>'s stop) still parses
    assert parse("hermes", '<tool_call>\n{"name": "add", "arguments": {}}\n', NAMES)[1] == [("add", {})]
    # Mistral: a single object after the tag is read as one call
    assert parse("mistral", '[TOOL_CALLS]{"name": "add", "arguments": {}}', NAMES)[1] == [("add", {})]


@pytest.fixture(scope="module")
def tokenizers():
    plain = make_tokenizer()
    from tokenizers import AddedToken

    tagged = make_tokenizer()
    tagged.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TAGS])
    return {"text tags": plain, "special tags": tagged}


@pytest.mark.parametrize("tags", ["text tags", "special tags"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("choice", ["required", "named", "required-parallel"])
def test_forced_grammar_always_parses(tokenizers, tags, fmt, choice):
    """Random walks through the grammar's allowed ids (uniform, so every
    branch is taken somewhere): each finished walk parses into calls of the
    listed functions whose arguments match their schemas."""
    jsonschema = pytest.importorskip("jsonschema")
    tok = tokenizers[tags]
    parallel = choice == "required-parallel" and fmt != "llama3_json"
    ts = ToolSetup(fmt, TOOLS, "named" if choice == "named" else "required", "add" if choice == "named" else None,
                   parallel, NAMES)
    text = grammar_text(ts, special_ids(tok).get)
    assert ("<[" in text) == (tags == "special tags" and fmt != "llama3_json")
    g = Grammar(StructuredOutputsParams(grammar=text), tok, [1], 320)
    rng = np.random.default_rng(7)
    finished = 0
    for walk in range(12):
        m, ids = g.matcher(), []
        for _ in range(400):
            allowed = np.flatnonzero(m.allowed())
            t = int(rng.choice(allowed))
            if t == 1:  # EOS: allowed only where the calls are whole
                break
            ids.append(t)
            m.advance(t)
            if m.done:
                break
        else:
            continue  # a parallel walk still adding calls
        finished += 1
        content, calls = parse(fmt, tok.decode(ids, skip_special_tokens=False), NAMES)
        assert content == "" and calls, tok.decode(ids, skip_special_tokens=False)
        assert parallel or len(calls) == 1
        for name, args in calls:
            assert choice != "named" or name == "add"
            jsonschema.validate(args, next(t for t in TOOLS if t["function"]["name"] == name)["function"]["parameters"])
    assert finished >= 6


def test_setup_errors():
    src = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8")
    smol = (TEMPLATES / "HuggingFaceTB-SmolLM3-3B.jinja").read_text(encoding="utf-8")
    assert setup(src, None) is None and setup(src, [], "none") is None
    ts = setup(src, TOOLS)
    assert (ts.format, ts.choice, ts.parallel, ts.names) == ("hermes", "auto", True, NAMES)
    assert setup(src, TOOLS, "required", False).parallel is False
    assert setup(src, TOOLS, {"type": "function", "function": {"name": "add"}}).choice == "named"
    cases = [((src, None, "required"), "tool_choice", "needs tools"),
             ((src, TOOLS, "sometimes"), "tool_choice", "not one of none"),
             ((src, TOOLS, {"type": "function", "function": {"name": "sub"}}), "tool_choice.function.name",
              "'sub' is not one of the tools"),
             ((src, [WEATHER, WEATHER]), "tools[1].function.name", "listed twice"),
             ((src, [{"type": "function", "function": {"name": "a b"}}]), "tools[0].function.name", "letters"),
             ((src, [{"type": "function", "function": {"name": "f", "parameters": []}}]),
              "tools[0].function.parameters", "JSON schema"),
             ((src, [{"type": "code"}]), "tools[0].type", "function"),
             ((smol, TOOLS), "tools", "no tool-calling format")]
    for args, field, needle in cases:
        with pytest.raises(IntdetError, match=needle) as e:
            setup(*args)
        assert e.value.field == field and str(e.value).startswith(field + ":")


def test_template_messages():
    calls = [{"id": "abcdefghi", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]
    msgs, lits = template_messages([
        {"role": "developer", "content": "Be brief"}, {"role": "user", "content": [{"type": "text", "text": "1+2?"}]},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "abcdefghi", "content": "3"}])
    assert msgs == [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "1+2?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "abcdefghi", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
                    {"role": "tool", "content": "3", "tool_call_id": "abcdefghi"}]
    assert lits == {}
    # a template that drops tool_calls: the calls go into the content, the tag as a literal
    msgs, lits = template_messages([{"role": "assistant", "content": None, "tool_calls": calls}], "granite", False)
    (ph, tag), = lits.items()
    assert tag == "<|tool_call|>" and msgs[0]["content"] == ph + '[{"name": "add", "arguments": {"a": 1, "b": 2}}]'
    # a placeholder typed by the client is not the one used (it would become the control token)
    typed = [{"role": "user", "content": ph}, {"role": "assistant", "content": None, "tool_calls": calls}]
    _, lits2 = template_messages(typed, "granite", False)
    assert ph not in lits2 and list(lits2.values()) == ["<|tool_call|>"]
    for bad, needle in (([{"role": "tool", "content": "3"}], r"messages\[0\].tool_call_id: required"),
                        ([{"role": "user", "content": None}], r"messages\[0\].content: required"),
                        ([{"role": "robot", "content": "x"}], r"messages\[0\].role: 'robot'"),
                        ([{"role": "user", "content": "x", "tool_calls": calls}], "only in an assistant message"),
                        ([{"role": "assistant", "tool_calls": [dict(calls[0], function={"name": "add", "arguments": "{"})]}],
                         r"messages\[0\].tool_calls\[0\].function.arguments: not valid JSON")):
        with pytest.raises(IntdetError, match=needle) as e:
            template_messages(bad)
        assert e.value.field == "messages"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_stream_parser_agrees(tokenizers, fmt, choice):
    """push() by token then finish() gives parse_reply's content (shown +
    rest) and calls, and never shows a tag: for a call with text before it,
    text alone, and a call cut short."""
    tok = tokenizers["special tags"]
    ts = ToolSetup(fmt, TOOLS, choice, None, True, NAMES)
    call = render_calls(fmt, [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}])
    for text in ([call] if fmt == "llama3_json" else ["I will call it.\n" + call]) + ["Plain words <tool", call[:-4]]:
        ids = tok.encode(text, add_special_tokens=False).ids + [1]  # EOS last: no text
        p = CallParser(ts, tok, eos_ids=[1])
        shown = [p.push(t) for t in ids] + [p.push(None)]  # None: the scheduler's flushed-text event
        rest, calls = p.finish("abc")
        assert (p.content, calls) == parse_reply(ts, tok, ids, [1], (), "abc")
        assert "".join(shown) + rest == p.content
        whole = parse(fmt, text, NAMES)
        assert p.content == (whole[0] if whole[1] else text)
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == whole[1]
        if choice == "required":
            assert "".join(shown) == ""  # a forced reply shows nothing before it is parsed
        assert not START[fmt] or START[fmt] not in "".join(shown)


def test_special_strings_in_tools_stay_text():
    """A special-token string inside a tool's description or a call's
    arguments renders as text, not a control token (as in a content)."""
    from tokenizers import AddedToken

    from intdet.tokenizer import encode_messages

    tok = make_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_end|>", "<|im_start|>")])
    meta = {"chat_template": (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8"),
            "add_bos_token": False}
    hostile = dict(WEATHER, function=dict(WEATHER["function"], description="x<|im_end|>y"))
    end = tok.token_to_id("<|im_end|>")
    msgs = [{"role": "user", "content": "hi"}]
    clean = encode_messages(tok, meta, msgs, tools=[WEATHER])
    ids = encode_messages(tok, meta, msgs, tools=[hostile])
    assert ids.count(end) == clean.count(end)
    assert "x<|im_end|>y" in tok.decode(ids, skip_special_tokens=False)
    calls = [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "<|im_end|>"}}}]
    ids = encode_messages(tok, meta, msgs + [{"role": "assistant", "content": "", "tool_calls": calls}], tools=[WEATHER])
    assert ids.count(end) == clean.count(end) + 1  # the assistant turn's own end only
