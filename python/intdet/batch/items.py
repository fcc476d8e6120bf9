"""The item schema of ``intdet batch``: one JSON object per input line.

Every item has an ``id`` (a string or an integer, unique in the file) and a
``task`` (default: ``--task``). Fields per task (anything else is an error
naming the field):

* ``generate``: exactly one of ``prompt`` (text), ``messages`` (chat
  ``[{"role", "content"}]``, run under the model's chat template) or ``ids``
  (token ids); sampling fields as ``intdet.SamplingParams``: ``max_tokens``,
  ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repeat_penalty``,
  ``repeat_last_n``, ``seed``, ``stop``, ``logprobs``, ``truncate``,
  ``structured_outputs`` (an object of ``StructuredOutputsParams`` fields:
  ``json``, ``json_object``, ``regex``, ``choice``, ``grammar``; needs
  ``intdet[structured]``).
* ``score``: ``context`` and ``continuation`` (text or ids; a text
  continuation is encoded without BOS), ``top`` (int, default 0).
* ``perplexity``: ``text`` (encoded without BOS, as ``intdet perplexity``)
  or ``ids``; ``ctx`` (optional): cut into non-overlapping windows of
  ``ctx`` tokens (perplexity.windows_of: a shorter last window is dropped);
  without it the whole text is one window and must fit the context.
* ``compress``: ``text`` (its UTF-8 bytes, compressed by intdet.compress
  into one container), ``ctx`` (tokens per chunk, default the smaller of
  the codec's 2048 and the context length), ``return_data`` (bool: include
  the container, base64).

Parsing here is structural only (JSON, types, field names); what needs the
model (vocabulary, context length) is checked by the worker, per item.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from ..logprobs import MAX_LOGPROBS

TASKS = ("generate", "score", "perplexity", "compress")
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n",
                   "seed", "stop", "logprobs", "truncate", "structured_outputs")
FIELDS = {
    "generate": ("prompt", "messages", "ids") + SAMPLING_FIELDS,
    "score": ("context", "continuation", "top"),
    "perplexity": ("text", "ids", "ctx"),
    "compress": ("text", "ctx", "return_data"),
}
MAX_LINE_BYTES = 16 << 20  # one item; larger lines are refused before json.loads


@dataclass
class Item:
    """One parsed input line: ``index`` (0-based line number), ``key`` (what
    resuming matches: see ``record_key``), ``id`` and ``task``, ``fields``
    (the item's other fields), or ``error`` (the line could not be used;
    then ``id`` may be None)."""

    index: int
    key: str
    id: object
    task: str
    fields: dict
    error: str = ""

    def digest(self) -> str:
        """16 hex digits of the sha256 of the item's task and fields (not its
        id, the resume key): a record carries it as ``item_sha256``, so a
        resumed job sees an input line that changed under the same id."""
        body = json.dumps({"task": self.task, "fields": self.fields}, sort_keys=True, ensure_ascii=False,
                          separators=(",", ":"))
        return hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps({"index": self.index, "id": self.id, "task": self.task, "fields": self.fields})

    @staticmethod
    def from_json(s: str) -> "Item":
        d = json.loads(s)
        return Item(d["index"], "", d["id"], d["task"], d["fields"])


def id_key(item_id) -> str:
    return "id:" + json.dumps(item_id)


def line_key(index: int) -> str:
    return f"line:{index + 1}"


def record_key(rec: dict) -> str:
    """The resume key of an output record: ``line:N`` for a record that
    carries its line number (a line without a usable id, or a duplicate id),
    else ``id:<json id>``."""
    return line_key(rec["line"] - 1) if "line" in rec else id_key(rec.get("id"))


def _is_id(v) -> bool:
    return isinstance(v, str) or isinstance(v, int) and not isinstance(v, bool)


def parse_line(index: int, raw, default_task: str, seen: dict) -> Item | None:
    """Parse input line ``index`` (0-based; bytes or str). Returns None for a
    blank line, else an Item (with ``error`` set when the line is unusable).
    ``seen`` maps id keys to the line index that first used them."""
    where = f"line {index + 1}"

    def bad(msg, item_id=None, task=None):
        return Item(index, line_key(index), item_id, task, {}, f"{where}: {msg}")

    try:  # as generate -f and perplexity -f: bytes that are not UTF-8 are refused, not replaced by U+FFFD
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as e:
        return bad(f"not valid UTF-8 (byte {e.start})")
    if not text.strip():
        return None
    if len(raw) > MAX_LINE_BYTES:
        return bad(f"{len(raw)} bytes, more than the {MAX_LINE_BYTES} a line may hold")
    try:
        d = json.loads(text)
    except ValueError as e:
        return bad(f"invalid JSON ({e})")
    try:  # JSON's "\\ud800" escapes decode to lone surrogates: not text, and no output could hold them
        json.dumps(d, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        return bad(f"a string holds a lone surrogate (U+{ord(e.object[e.start]):04X}), not valid Unicode text")
    if not isinstance(d, dict):
        return bad(f"expected a JSON object, got {type(d).__name__}")
    if "id" not in d:
        return bad("no 'id' field")
    item_id = d.pop("id")
    if not _is_id(item_id):
        return bad(f"id: {item_id!r} must be a string or an integer")
    key = id_key(item_id)
    if key in seen:
        task = d.get("task", default_task)
        return bad(f"id {json.dumps(item_id)} is also the id of line {seen[key] + 1}", item_id,
                   task if isinstance(task, str) else None)
    seen[key] = index
    task = d.pop("task", default_task)
    if task not in TASKS:
        return Item(index, key, item_id, task if isinstance(task, str) else None, {},
                    f"task: {task!r} is not one of {', '.join(TASKS)}")
    unknown = [k for k in d if k not in FIELDS[task]]
    if unknown:
        return Item(index, key, item_id, task, {}, f"{unknown[0]}: not a field of a {task} item "
                                                   f"(fields: {', '.join(FIELDS[task])})")
    err = _check_fields(task, d)
    return Item(index, key, item_id, task, d if not err else {}, err)


def _is_ids(v) -> bool:
    return isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def _text_or_ids(d: dict, name: str) -> str:
    v = d.get(name)
    if not (isinstance(v, str) or _is_ids(v)):
        return f"{name}: must be a string or a list of integer token ids"
    return ""


def _check_fields(task: str, d: dict) -> str:
    if task == "generate":
        given = [k for k in ("prompt", "messages", "ids") if k in d]
        if len(given) != 1:
            return "give exactly one of prompt, messages, ids"
        k = given[0]
        if k == "prompt" and not isinstance(d[k], str):
            return "prompt: must be a string"
        if k == "ids" and not _is_ids(d[k]):
            return "ids: must be a list of integer token ids"
        if k == "messages" and not isinstance(d[k], list):
            return "messages: must be a list of {\"role\", \"content\"}"
        return ""
    if task == "score":
        for name in ("context", "continuation"):
            if name not in d:
                return f"{name}: missing"
            err = _text_or_ids(d, name)
            if err:
                return err
        top = d.get("top", 0)
        if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_LOGPROBS:
            return f"top: {top!r} must be an integer in [0, {MAX_LOGPROBS}]"  # as LLM.score takes it
        return ""
    if task == "perplexity":
        given = [k for k in ("text", "ids") if k in d]
        if len(given) != 1:
            return "give exactly one of text, ids"
        if given[0] == "text" and not isinstance(d["text"], str):
            return "text: must be a string"
        if given[0] == "ids" and not _is_ids(d["ids"]):
            return "ids: must be a list of integer token ids"
        ctx = d.get("ctx")
        if ctx is not None and (not isinstance(ctx, int) or isinstance(ctx, bool) or ctx < 2):
            return f"ctx: {ctx!r} must be an integer >= 2"
        return ""
    if "text" not in d or not isinstance(d["text"], str):
        return "text: must be a string"
    ctx = d.get("ctx")
    if ctx is not None and (not isinstance(ctx, int) or isinstance(ctx, bool) or ctx < 1):
        return f"ctx: {ctx!r} must be an integer >= 1"
    if not isinstance(d.get("return_data", False), bool):
        return "return_data: must be true or false"
    return ""
