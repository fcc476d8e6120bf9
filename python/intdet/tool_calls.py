"""Tool calling (OpenAI's ``tools`` / ``tool_choice``) in the model's own
chat-template format: detect the format from the template, check the
request's tools and messages, render the conversation, build the exact
grammar that forces a call, and parse the generated text back into
OpenAI's ``tool_calls``.

Formats (``FORMATS``), detected from the chat template's source:

- ``hermes``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call, newline-separated (Qwen2.5, Qwen3, SmolLM3's own
  template, Hermes 2 Pro, ...);
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``
  (Mistral Nemo, Mistral Small, ...);
- ``granite``: ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]``
  (Granite 3.x);
- ``llama3_json``: the whole reply is ``{"name": ..., "parameters": {...}}``
  (optionally after ``<|python_tag|>``; Llama 3.1, 3.2, 3.3): one call per
  reply, as the template can render no more.

``tool_choice``: ``"none"`` renders the tools and parses nothing;
``"auto"`` parses what the model wrote (text that is not a whole valid call
of a listed function stays content); ``"required"`` and a named function
generate under a grammar (``grammar_text``: the format's tags around a JSON
schema per function, with the function's ``parameters`` as the arguments'
schema), so a finished reply always parses. Parsing reads the generated ids
decoded with special tokens shown (the markers are control tokens in most
vocabularies), as vLLM does for tool requests.

Call ids are derived from the reply's chain hash and the call's index (the
same reply gives the same ids on every run); Mistral's templates want 9
alphanumeric characters, the others get ``call_`` and 24 hex digits.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Optional

from .errors import IntdetError

FORMATS = ("hermes", "mistral", "granite", "llama3_json")
# the tags that open (and close) a format's calls
START = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "granite": "<|tool_call|>", "llama3_json": ""}
END = {"hermes": "</tool_call>"}
PYTHON_TAG = "<|python_tag|>"
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's function names (and "." as vLLM allows)
# JSON written by the grammar as the templates write it (json.dumps's separators)
JSON_WS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CHOICES = ("none", "auto", "required")


def detect_format(template: Optional[str]) -> Optional[str]:
    """The tool-call format of a chat template's source (one of FORMATS),
    or None when it renders no tools intdet knows how to parse."""
    if not template or "tools" not in template:
        return None
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|tool_call|>" in template:
        return "granite"
    if "<tool_call>" in template:
        return "hermes"
    if '"parameters": ' in template and "tool_call" in template:
        return "llama3_json"
    return None


@functools.lru_cache(maxsize=16)
def renders_tool_calls(template: str, bos_token: str = "", eos_token: str = "") -> bool:
    """Whether the template writes an assistant message's ``tool_calls``
    itself (Granite 3.3's drops them; tool_calls.py then writes the call
    text into the message's content)."""
    from .tokenizer import render_chat

    probe = "intdet_probe_fn"
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "abcdefghi", "type": "function", "function": {"name": probe, "arguments": {"a": 1}}}]},
            {"role": "tool", "content": "r", "tool_call_id": "abcdefghi"}]
    # the tool listed under another name: the probe's name must come from the call alone
    tools = [{"type": "function", "function": {"name": "intdet_probe_tool", "parameters": {"type": "object"}}}]
    try:
        meta = {"chat_template": template, "bos_token": bos_token, "eos_token": eos_token}
        return probe in render_chat(meta, msgs, add_generation_prompt=True, tools=tools)
    except Exception:  # noqa: BLE001  (a template that refuses the probe: treat as not rendering)
        return False


@dataclass
class ToolSetup:
    """A request's tools, checked. ``tools``: OpenAI's definitions (dicts);
    ``choice``: "none", "auto", "required" or "named" (``name``: the
    function); ``parallel``: more than one call allowed; ``format``: one of
    FORMATS."""

    format: str
    tools: list
    choice: str
    name: Optional[str] = None
    parallel: bool = True
    names: list = field(default_factory=list)

    @property
    def parses(self) -> bool:
        return self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "named")


def _fn(tool, i: int) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise IntdetError(f"{where}: must be an object {{\"type\": \"function\", \"function\": {{...}}}}", field=where)
    if tool.get("type", "function") != "function":
        raise IntdetError(f"{where}.type: must be \"function\"", field=f"{where}.type")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise IntdetError(f"{where}.function: must be an object with a name", field=f"{where}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise IntdetError(f"{where}.function.name: must be 1 to 64 letters, digits, '_', '-' or '.' "
                          f"(got {name!r})"[:160], field=f"{where}.function.name")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise IntdetError(f"{where}.function.parameters: must be a JSON schema object", field=f"{where}.function.parameters")
    return fn


def setup(template: Optional[str], tools, tool_choice=None, parallel_tool_calls=None) -> Optional[ToolSetup]:
    """The checked ToolSetup of a request, or None without tools.

    ``tools``: None or a list of ``{"type": "function", "function": {"name",
    "description", "parameters"}}``; ``tool_choice``: None (``"auto"`` with
    tools), "none", "auto", "required" or ``{"type": "function", "function":
    {"name": ...}}``; ``parallel_tool_calls``: None (true) or a bool.
    Raises IntdetError naming the field (``tools``, ``tools[i]...``,
    ``tool_choice``) for a bad value, a named function not in tools, or a
    template with no tool-call format (``detect_format``)."""
    if tools is None or (isinstance(tools, list) and not tools):
        if tool_choice not in (None, "none"):
            raise IntdetError("tool_choice: needs tools", field="tool_choice")
        return None
    if not isinstance(tools, list):
        raise IntdetError("tools: must be a list of {\"type\": \"function\", \"function\": {...}}", field="tools")
    names = []
    for i, t in enumerate(tools):
        name = _fn(t, i)["name"]
        if name in names:
            raise IntdetError(f"tools[{i}].function.name: {name!r} is listed twice", field=f"tools[{i}].function.name")
        names.append(name)
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise IntdetError("parallel_tool_calls: must be true or false", field="parallel_tool_calls")
    choice, name = "auto" if tool_choice is None else tool_choice, None
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise IntdetError("tool_choice: must be \"none\", \"auto\", \"required\" or "
                              "{\"type\": \"function\", \"function\": {\"name\": ...}}", field="tool_choice")
        if name not in names:
            raise IntdetError(f"tool_choice.function.name: {name!r} is not one of the tools ({', '.join(names)})"[:200],
                              field="tool_choice.function.name")
        choice = "named"
    elif choice not in CHOICES:
        raise IntdetError(f"tool_choice: {choice!r} is not one of none, auto, required or a named function"[:160],
                          field="tool_choice")
    fmt = detect_format(template)
    if fmt is None:
        raise IntdetError("tools: this model's chat template has no tool-calling format intdet knows "
                          "(Hermes <tool_call>, Mistral [TOOL_CALLS], Granite <|tool_call|>, Llama 3 JSON)",
                          field="tools")
    parallel = parallel_tool_calls is not False and fmt != "llama3_json" and choice != "named"
    return ToolSetup(fmt, [dict(t, type="function") for t in tools], choice, name, parallel, names)


# ------------------------------------------------------------------ messages


def template_messages(messages: list, fmt: Optional[str] = None, renders_calls: bool = True, tools=None) -> tuple:
    """OpenAI chat messages -> (the template's messages, literals for
    tokenizer.encode_messages). ``developer`` is rendered as ``system``; a
    null content is ""; text parts are joined; an assistant message's
    ``tool_calls[j].function.arguments`` (a JSON string) is given to the
    template as the object it encodes, as vLLM does (templates write it with
    tojson). With ``renders_calls`` false (the template drops tool_calls),
    the calls are written into the content in the format ``fmt``, its tag
    as a placeholder no string of messages or ``tools`` holds (literals
    maps it to the tag's special-token string).
    Raises IntdetError naming ``messages[i]...`` for a bad message."""
    out: list = []
    literals: dict = {}
    placeholder = None
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise IntdetError(f"{where}: must be an object with a role", field="messages")
        role = m["role"]
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise IntdetError(f"{where}.role: {role!r}: choose one of system, developer, user, assistant, tool"[:160],
                              field="messages")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise IntdetError(f"{where}.content: must be a string or a list of {{\"type\": \"text\", \"text\": "
                                  f"str}} parts", field="messages")
            content = "".join(p["text"] for p in content)
        calls = m.get("tool_calls")
        if content is None and not (role == "assistant" and calls):
            raise IntdetError(f"{where}.content: required (null only in an assistant message with tool_calls)",
                              field="messages")
        if not isinstance(content, (str, type(None))):
            raise IntdetError(f"{where}.content: must be a string or a list of text parts", field="messages")
        msg: dict = {"role": "system" if role == "developer" else role, "content": content or ""}
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        if calls is not None:
            if role != "assistant":
                raise IntdetError(f"{where}.tool_calls: only in an assistant message", field="messages")
            msg["tool_calls"] = [_history_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
            if not renders_calls and fmt is not None and msg["tool_calls"]:
                if placeholder is None:
                    blob, n = json.dumps([messages, tools], ensure_ascii=False, default=str), 0
                    while f"\ue001intdet-call-{n}\ue001" in blob:
                        n += 1
                    placeholder = f"\ue001intdet-call-{n}\ue001"
                literals[placeholder] = START[fmt]
                text = render_calls(fmt, msg["tool_calls"]).replace(START[fmt], placeholder, 1)
                msg["content"] = (msg["content"] + "\n" if msg["content"] else "") + text
        if role == "tool":
            tid = m.get("tool_call_id")
            if not isinstance(tid, str):
                raise IntdetError(f"{where}.tool_call_id: required in a tool message (the id of the call it answers)",
                                  field="messages")
            msg["tool_call_id"] = tid
        out.append(msg)
    return out, literals


def _history_call(c, where: str) -> dict:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(c.get("id", ""), str):
        raise IntdetError(f"{where}: must be {{\"id\": str, \"type\": \"function\", \"function\": {{\"name\": str, "
                          f"\"arguments\": str}}}}", field="messages")
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise IntdetError(f"{where}.function.arguments: not valid JSON", field="messages") from None
    if not isinstance(args, dict):
        raise IntdetError(f"{where}.function.arguments: must encode a JSON object", field="messages")
    return {"id": c.get("id", ""), "type": "function", "function": {"name": fn["name"], "arguments": args}}


def render_calls(fmt: str, calls: list) -> str:
    """Calls ([{"function": {"name", "arguments": dict}}]) as the format writes them."""
    objs = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]
    if fmt == "hermes":
        return "\n".join(f"<tool_call>\n{json.dumps(o, ensure_ascii=False)}\n</tool_call>" for o in objs)
    if fmt == "llama3_json":
        return "; ".join(json.dumps({"name": o["name"], "parameters": o["arguments"]}, ensure_ascii=False)
                         for o in objs)
    return START[fmt] + json.dumps(objs, ensure_ascii=False)


# ------------------------------------------------------------------ grammar


def call_schema(fmt: str, tool: dict) -> dict:
    """The JSON schema of one call of ``tool`` in format ``fmt``: the name
    fixed, the arguments under the tool's ``parameters`` ($defs lifted to
    the top, where their references point)."""
    params = dict(tool["function"].get("parameters") or {"type": "object", "properties": {},
                                                          "additionalProperties": False})
    defs = {k: params.pop(k) for k in ("$defs", "definitions") if k in params}
    key = "parameters" if fmt == "llama3_json" else "arguments"
    schema = {"type": "object", "properties": {"name": {"const": tool["function"]["name"]}, key: params},
              "required": ["name", key], "additionalProperties": False, "x-guidance": JSON_WS}
    schema.update(defs)
    return schema


def grammar_text(ts: ToolSetup, special_id) -> str:
    """The Lark grammar (llguidance's dialect) a forced reply (tool_choice
    "required" or named) must match: one call, or with ``ts.parallel`` one
    or more, in the format's tags. ``special_id(text)``: the id of a
    special token whose text is ``text``, or None (the tag is then text).
    The one place the tool grammar is built (compile it as
    ``StructuredOutputsParams(grammar=...)``)."""
    def lit(text: str) -> str:
        i = special_id(text) if text else None
        return f"<[{i}]>" if i is not None else json.dumps(text)

    tools = [t for t in ts.tools if ts.choice != "named" or t["function"]["name"] == ts.name]
    rules = [f"fn{k}: %json {json.dumps(call_schema(ts.format, t), ensure_ascii=False)}" for k, t in enumerate(tools)]
    call = "call: " + " | ".join(f"fn{k}" for k in range(len(tools)))
    if ts.format == "hermes":
        one = f'one: {lit("<tool_call>")} "\\n" call "\\n" {lit("</tool_call>")}'
        start = 'start: one ("\\n" one)*' if ts.parallel else "start: one"
        return "\n".join([start, one, call, *rules])
    if ts.format == "llama3_json":
        return "\n".join(["start: call", call, *rules])
    more = ' (", " call)*' if ts.parallel else ""
    return "\n".join([f'start: {lit(START[ts.format])} "[" call{more} "]"', call, *rules])


def tool_grammar(ts: Optional[ToolSetup], tokenizer, compile_grammar) -> tuple:
    """(StructuredOutputsParams, compiled grammar) a reply under ``ts`` must
    match, or (None, None): with tool_choice "required" or a named function
    the format's calls (``grammar_text``). Every tool's ``parameters`` is
    compiled first (tool_choice other than "none"). ``compile_grammar(so)``
    compiles (``LLM.grammar``, cached there). Raises IntdetError naming
    ``tools[i].function.parameters`` for a schema the structured-output
    library cannot compile, ``tools`` for the whole grammar."""
    from .structured import StructuredOutputsParams

    if ts is None or not ts.parses:
        return None, None
    for i, t in enumerate(ts.tools):
        where = f"tools[{i}].function.parameters"
        try:
            compile_grammar(StructuredOutputsParams(json=call_schema(ts.format, t)))
        except IntdetError as e:
            raise IntdetError(where + _rest(str(e), "structured_outputs.json"), field=where) from None
    if not ts.forced:
        return None, None
    so = StructuredOutputsParams(grammar=grammar_text(ts, special_ids(tokenizer).get))
    try:
        return so, compile_grammar(so)
    except IntdetError as e:
        raise IntdetError("tools" + _rest(str(e), "structured_outputs.grammar"), field="tools") from None


def _rest(msg: str, prefix: str) -> str:
    return msg[len(prefix):] if msg.startswith(prefix) else ": " + msg


# ------------------------------------------------------------------ parsing


def call_id(fmt: str, reply_hash: str, index: int) -> str:
    """The id of a reply's index-th call: from the reply's chain hash, so
    the same reply gets the same id."""
    h = hashlib.sha256(f"{reply_hash}:{index}".encode()).hexdigest()
    if fmt == "mistral":  # its template wants 9 alphanumeric characters
        return h[:9]
    return "call_" + h[:24]


def _decode_all(text: str):
    """JSON values in text, one after another (separated by whitespace, ',' or ';'), or None."""
    dec, out, pos = json.JSONDecoder(), [], 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,;":
            pos += 1
        if pos == len(text):
            return out
        try:
            v, pos = dec.raw_decode(text, pos)
        except ValueError:
            return None
        out.append(v)


def _as_call(obj, names, key="arguments"):
    """(name, arguments dict) of a parsed call object, or None."""
    if not isinstance(obj, dict):
        return None
    args = obj.get(key, obj.get("arguments" if key != "arguments" else "parameters"))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    name = obj.get("name")
    if not isinstance(name, str) or name not in names or not isinstance(args, dict):
        return None
    return name, args


def parse(fmt: str, text: str, names) -> tuple:
    """(content, [(name, arguments dict)]) of a reply's text (special tokens
    shown): the calls in the format, and the text before them as content.
    Text that is not wholly valid calls of listed functions after the
    format's opening tag gives (text, [])."""
    none = (text, [])
    if fmt == "llama3_json":
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):]
        for end in ("<|eom_id|>", "<|eot_id|>"):
            body = body.removesuffix(end)
        if not body.lstrip().startswith("{"):
            return none
        objs = _decode_all(body)
        calls = [_as_call(o, names, "parameters") for o in objs or []]
        return ("", calls) if objs and all(calls) else none
    start = START[fmt]
    at = text.find(start)
    if at < 0:
        return none
    content, rest = text[:at], text[at:]
    if fmt == "hermes":
        blocks = re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", rest, re.S)
        leftover = re.sub(r"<tool_call>.*?(?:</tool_call>|$)", "", rest, flags=re.S)
        objs = [_decode_all(b) for b in blocks]
        if leftover.strip() or not all(o is not None and len(o) == 1 for o in objs):
            return none
        calls = [_as_call(o[0], names) for o in objs]
    else:
        objs = _decode_all(rest[len(start):])
        if not objs or len(objs) != 1:
            return none
        items = objs[0] if isinstance(objs[0], list) else [objs[0]]
        calls = [_as_call(o, names) for o in items]
    return (content, calls) if calls and all(calls) else none


def openai_calls(fmt: str, calls: list, reply_hash: str) -> list:
    """Parsed calls as OpenAI's ``tool_calls`` (arguments as JSON text)."""
    return [{"id": call_id(fmt, reply_hash, j), "type": "function",
             "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
            for j, (name, args) in enumerate(calls)]


class CallParser:
    """One reply's text as it is generated, split into content that is safe
    to show now and, at the end, the calls.

    ``push(id)`` -> the content text now safe to show (None: nothing) (text that may be the
    start of a call is held back); ``finish(reply_hash)`` -> (the content not
    yet shown, OpenAI tool_calls or [] when the text holds no valid call).
    The content shown plus the rest equals ``parse``'s content. Ids in
    ``eos_ids`` have no text; ``stop`` strings end the text as the
    scheduler's do."""

    def __init__(self, ts: ToolSetup, tokenizer, eos_ids=(), stop=()):
        from .generate import TextStream

        self.ts = ts
        self._eos = frozenset(int(e) for e in eos_ids)
        self._stream = TextStream(tokenizer, stop, skip_special_tokens=False)
        self.text = ""
        self.content = ""  # the whole content, once finished
        self._shown = 0

    def push(self, token) -> str:
        if token is None or int(token) in self._eos:  # None: the scheduler's last text event (flushed text)
            return ""
        piece, _ = self._stream.push(token)
        self.text += piece
        return self._show()

    def _show(self) -> str:
        text, fmt = self.text, self.ts.format
        if self.ts.forced:
            safe = 0
        elif fmt == "llama3_json":
            body = text.lstrip()
            # a reply that starts as a call is held whole; any other is content
            safe = 0 if (not body or body.startswith("{") or PYTHON_TAG.startswith(body[:len(PYTHON_TAG)])) \
                else len(text)
        else:
            start = START[fmt]
            at = text.find(start)
            if at >= 0:
                safe = at
            else:
                safe = len(text)
                for k in range(min(len(start) - 1, len(text)), 0, -1):
                    if start.startswith(text[len(text) - k:]):
                        safe = len(text) - k
                        break
        safe = max(safe, self._shown)
        out, self._shown = text[self._shown:safe], safe
        return out

    def finish(self, reply_hash: str) -> tuple:
        self.text += self._stream.flush()
        content, calls = parse(self.ts.format, self.text, self.ts.names)
        if not calls:
            content = self.text
        self.content = content
        rest = content[self._shown:] if len(content) >= self._shown else ""
        return rest, openai_calls(self.ts.format, calls, reply_hash)


def parse_reply(ts: ToolSetup, tokenizer, tokens, eos_ids, stop, reply_hash: str) -> tuple:
    """(content, tool_calls) of a finished reply's ids: CallParser over them."""
    p = CallParser(ts, tokenizer, eos_ids, stop)
    shown = "".join(p.push(t) for t in tokens)
    rest, calls = p.finish(reply_hash)
    return shown + rest, calls


def special_ids(tokenizer) -> dict:
    """{text: id} of the tokenizer's special added tokens."""
    return {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}

