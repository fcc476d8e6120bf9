"""Chat prompts: render a model's jinja chat template (sandboxed, as transformers'
apply_chat_template) and encode the result, special-token strings typed by the user
kept plain."""

from __future__ import annotations

import datetime
import functools
import json
import os
import re
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer

from .text import check_text, encode


class _GenerationTag(jinja2.ext.Extension):
    """Accepts transformers' ``{% generation %}...{% endgeneration %}`` (assistant-mask
    markers) so such templates render; the body is output unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' version: no HTML escaping, unlike jinja2's built-in tojson.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    # Templates such as Llama 3's print today's date; SOURCE_DATE_EPOCH pins it so a
    # rendered prompt can be reproduced.
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    now = (datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc) if epoch
           else datetime.datetime.now())
    return now.strftime(fmt)


@functools.lru_cache(maxsize=8)
def _compile_template(source: str) -> jinja2.Template:
    # Same environment as transformers' apply_chat_template; sandboxed because chat
    # templates come from model files.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat(meta: dict, messages: list[dict], add_generation_prompt: bool = True,
                **variables: Any) -> str:
    """Render ``meta['chat_template']`` for ``messages`` (``[{"role": str, "content": str}, ...]``)
    and return the prompt ``str``. ``bos_token``/``eos_token`` come from meta; extra keyword
    ``variables`` (e.g. ``tools``) are passed to the template.

    Encode the result with ``encode(..., special=True)`` and usually ``add_bos=False``
    (most templates write the BOS text themselves).

    Raises:
        ValueError: the model has no chat template.
        TypeError: ``messages`` is not a list of dicts.
        jinja2.TemplateError: the template is invalid, calls ``raise_exception`` or fails
            in its own code (a TypeError there, say); ``jinja2.exceptions.SecurityError``
            for unsafe attribute access.
    """
    source = meta.get("chat_template")
    if not source:
        raise ValueError("model has no chat template; drop --chat")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise TypeError("messages must be a list of dicts")
    template = _compile_template(source)
    try:
        return template.render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=meta.get("bos_token") or "", eos_token=meta.get("eos_token") or "", **variables)
    except (TypeError, ValueError, LookupError, ArithmeticError, AttributeError, RecursionError) as e:
        # Python's own errors inside the template's code ('a' + 1): the template failed, name it so
        msg = str(e).splitlines()[0] if str(e) else ""
        raise jinja2.TemplateError(f"{type(e).__name__}: {msg}" if msg else type(e).__name__) from None


def encode_chat(tok: Tokenizer, meta: dict, user_text: str, system: str | None = None) -> list[int]:
    """Token ids of a one-turn chat prompt (with the generation prompt);
    ``system`` adds a system message (else the template's default applies).
    See :func:`encode_messages`."""
    msgs = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": user_text}]
    return encode_messages(tok, meta, msgs)


def encode_messages(tok: Tokenizer, meta: dict, messages: list[dict],
                    add_generation_prompt: bool = True, tools: list | None = None,
                    literals: dict | None = None) -> list[int]:
    """Token ids of a chat (``[{"role", "content"}, ...]``) rendered by the
    model's template, ending with the generation prompt. ``tools``: OpenAI's
    tool definitions (``[{"type": "function", "function": {...}}]``), passed
    to the template as ``tools`` when given.

    As in transformers' ``apply_chat_template``, the template sees the real
    contents (it may trim them or look inside them) and its output is
    tokenized as one text, so tokens that span a content's edges come out as
    they would there. Unlike there, a special-token string typed inside a
    content ("<|im_end|>"), or anywhere in a message's other strings (tool
    calls) or in ``tools``, cannot become a control token: it is swapped for
    a private marker before rendering, and each marker is encoded as the
    plain text of its string. ``literals``: {placeholder: special-token
    string} written as control tokens where a placeholder appears in the
    rendered text (intdet's own text put in a message, tool_calls.py). BOS
    is added when meta asks for it and the template did not write it.
    Raises what :func:`render_chat` raises, and IntdetError naming
    ``messages[i].content`` (or ``tools``) for text that is not valid Unicode.
    """
    contents = [m.get("content") if isinstance(m, dict) else None for m in messages] if isinstance(
        messages, list) else []
    for i, c in enumerate(contents):
        if isinstance(c, str):
            check_text(c, f"messages[{i}].content")
    for s in _strings(tools):
        check_text(s, "tools")
    specials = sorted({t.content for t in tok.get_added_tokens_decoder().values() if t.special}, key=len,
                      reverse=True)
    typed: list[str] = []  # the special-token strings found in the strings, by marker number
    strings = list(_strings(messages)) + list(_strings(tools)) if isinstance(messages, list) else []
    if specials and strings:
        n = 0  # a marker prefix no string holds
        while any(f"{_MARK}intdet-{n}-" in s for s in strings):
            n += 1
        prefix, found = f"{_MARK}intdet-{n}-", re.compile("|".join(map(re.escape, specials)))

        def swap(match):
            typed.append(match.group(0))
            return f"{prefix}{len(typed) - 1}{_MARK}"

        messages = _map_strings(messages, lambda s: found.sub(swap, s))
        if tools is not None:
            tools = _map_strings(tools, lambda s: found.sub(swap, s))
    variables = {} if tools is None else {"tools": tools}
    rendered = render_chat(meta, messages, add_generation_prompt=add_generation_prompt, **variables)
    bos = meta.get("bos_token")
    add_bos = bool(meta.get("add_bos_token")) and not (bos and rendered.startswith(bos))
    if not typed:
        return _encode_literals(tok, meta, rendered, add_bos, literals)
    pieces = re.split(f"{re.escape(prefix)}(\\d+){_MARK}", rendered)
    ids = _encode_literals(tok, meta, pieces[0], add_bos, literals)
    for j in range(1, len(pieces), 2):
        ids += encode(tok, meta, typed[int(pieces[j])], add_bos=False)  # plain text
        ids += _encode_literals(tok, meta, pieces[j + 1], False, literals)
    return ids


# Private-use character around swap markers: kept as is by templates' tojson (unlike "\x00", which
# JSON escapes), so a marker inside a tool's JSON is found again after rendering.
_MARK = "\ue000"


def _strings(x):
    """Every str inside x (nested dicts and lists; dict keys included)."""
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _strings(v)


def _map_strings(x, f):
    if isinstance(x, str):
        return f(x)
    if isinstance(x, dict):
        return {_map_strings(k, f): _map_strings(v, f) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_map_strings(v, f) for v in x]
    return x


def _encode_literals(tok, meta, text: str, add_bos: bool, literals: dict | None) -> list[int]:
    """encode(..., special=True) of text with each literals placeholder as its special string."""
    for placeholder, special in (literals or {}).items():
        text = text.replace(placeholder, special)
    return encode(tok, meta, text, add_bos=add_bos, special=True)
