"""Structured output: a JSON schema, any JSON object, a GBNF or Lark grammar,
a regular expression or a list of choices, applied as an exact mask on the
int32 logits before sampling.

llguidance (the guidance project's Earley parser with a token trie, the
engine vLLM and SGLang offer beside xgrammar; https://github.com/guidance-ai/llguidance)
compiles the grammar against the model's tokenizer and, before each token,
gives the set of ids that keep the text a prefix of the language. The mask
only removes ids; it never changes a logit, so:

- the chosen token is the sampler's pick over the allowed ids (greedy: the
  largest allowed logit, lowest id on ties; sampled: the same keyed draw over
  the allowed ids' integer weights; sampling.Sampler.pick);
- the chain hash covers the model's unmasked logits (docs/chain-hash.md), so a
  verifier re-runs prompt + tokens without the grammar; log-probabilities are
  the model's too (as vLLM's default ``raw_logprobs``);
- the mask depends only on the ids generated so far, so it is the same set in
  any batch, prefill split, ISA or engine, and so are the tokens.

JSON schemas are compiled with whitespace fixed (``", "`` between items,
``": "`` after keys, no other whitespace; a schema's own ``x-guidance``
options win): small models given free whitespace can emit blank lines until
max_tokens.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import numpy as np

from .errors import IntdetError

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
KINDS = ("json", "json_object", "regex", "choice", "grammar")

# Sizes checked before anything is compiled (a request's bytes bound the
# compile's work; llguidance's own limits bound the rest, see parser_limits).
MAX_GRAMMAR_BYTES = 256 << 10  # a JSON schema's text, a regex or a grammar
MAX_CHOICES = 1000  # llguidance's parser holds one item per choice in a row and refuses rows over 2000
MAX_CHOICE_BYTES = 64 << 10  # all the choice strings together


def _llguidance():
    try:
        import llguidance
    except ImportError:  # a dependency of intdet; only a broken install lacks it
        raise IntdetError("structured output needs llguidance: pip install 'intdet[structured]'") from None
    return llguidance


_LIMITS = None


def parser_limits():
    """llguidance's ``LLParserLimits`` for every grammar intdet compiles: the
    library's defaults (its lexer fuel and parser item caps bound the time of
    a compile and of each mask), with short errors that hold none of the
    parser's state."""
    global _LIMITS
    if _LIMITS is None:
        _LIMITS = _llguidance().LLParserLimits(verbose_errors=False)
    return _LIMITS


def _json_kind(v) -> str:
    """JSON's name for a decoded value's type (null, array, string, number)."""
    return ("null" if v is None else "array" if isinstance(v, list) else "string" if isinstance(v, str)
            else "number" if isinstance(v, (int, float)) else type(v).__name__)


@dataclass
class StructuredOutputsParams:
    """What the output must match (vLLM's ``StructuredOutputsParams``; set one).

    json: a JSON schema (dict or its JSON text); json_object: any JSON object
    (OpenAI's ``{"type": "json_object"}``); regex: a regular expression (Rust
    regex syntax) the whole output matches; choice: a list of strings, the
    output is one of them; grammar: a GBNF (llama.cpp) or Lark grammar text.
    Raises IntdetError naming the field when none or several are set or a
    value has the wrong type (a bad schema or grammar is found by
    ``compile_grammar``).
    """

    json: Union[dict, str, None] = None
    json_object: bool = False
    regex: Optional[str] = None
    choice: Optional[Sequence[str]] = None
    grammar: Optional[str] = None

    def __post_init__(self):
        self.check()

    def _given(self) -> list:
        # json_object: false is "not set"; a JSON schema may be false
        return [k for k in KINDS if getattr(self, k) is not None and not (k == "json_object" and self.json_object is False)]

    def kind(self) -> str:
        return self._given()[0]

    def check(self) -> None:
        given = self._given()
        if len(given) != 1:
            raise IntdetError(f"structured_outputs: set exactly one of {', '.join(KINDS)} "
                              f"(got {', '.join(given) or 'none'})", field="structured_outputs")
        k = given[0]
        v = getattr(self, k)
        f = f"structured_outputs.{k}"
        if k == "json" and not isinstance(v, (dict, bool, str)):
            raise IntdetError(f"{f}: must be a JSON schema (an object, true, false or its JSON text)", field=f)
        if k == "json_object" and v is not True:
            raise IntdetError(f"{f}: must be true or false", field=f)
        if k in ("regex", "grammar") and (not isinstance(v, str) or not v.strip()):
            raise IntdetError(f"{f}: must be a non-empty string", field=f)
        if k == "choice" and (isinstance(v, str) or not isinstance(v, (list, tuple)) or not v
                              or not all(isinstance(c, str) and c for c in v)):
            raise IntdetError(f"{f}: must be a non-empty list of non-empty strings", field=f)
        self._check_size(k, v, f)

    @staticmethod
    def _check_size(k: str, v, f: str) -> None:
        """The size limits (MAX_GRAMMAR_BYTES, MAX_CHOICES, MAX_CHOICE_BYTES)."""
        if k == "choice":
            if len(v) > MAX_CHOICES:
                raise IntdetError(f"{f}: {len(v)} strings is more than the limit of {MAX_CHOICES}", field=f)
            n = sum(len(c.encode("utf-8", "surrogatepass")) for c in v)
            if n > MAX_CHOICE_BYTES:
                raise IntdetError(f"{f}: {n} bytes of strings is more than the limit of {MAX_CHOICE_BYTES}", field=f)
            return
        if k == "json" and isinstance(v, dict):
            try:
                v = json.dumps(v)
            except (TypeError, ValueError, RecursionError):
                raise IntdetError(f"{f}: not a JSON value (a circular or non-JSON object)", field=f) from None
        if isinstance(v, str):
            n = len(v.encode("utf-8", "surrogatepass"))
            if n > MAX_GRAMMAR_BYTES:
                what = "JSON schema" if k == "json" else k
                raise IntdetError(f"{f}: a {what} of {n} bytes is more than the limit of {MAX_GRAMMAR_BYTES}",
                                  field=f)

    def grammar_text(self) -> str:
        """llguidance's grammar definition (JSON text) of this constraint."""
        llg = _llguidance()
        k = self.kind()
        f = f"structured_outputs.{k}"
        try:
            if k in ("json", "json_object"):
                schema = {"type": "object"} if k == "json_object" else self.json
                if isinstance(schema, str):
                    try:
                        schema = json.loads(schema)
                    except ValueError as e:
                        raise IntdetError(f"{f}: not valid JSON: {e}", field=f) from None
                if not isinstance(schema, (dict, bool)):
                    raise IntdetError(f"{f}: a JSON schema is an object or true/false (got {_json_kind(schema)})", field=f)
                if schema is False:  # JSON Schema's false: no value is valid
                    raise IntdetError(f"{f}: the schema false allows no output", field=f)
                if schema is True:  # JSON Schema's true: any JSON value, as the empty schema
                    schema = {}
                return llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
            if k == "regex":
                return llg.LLMatcher.grammar_from_regex(self.regex)
            if k == "choice":
                return llg.grammar_from("choice", json.dumps(list(self.choice or ())))
            return llg.grammar_from("grammar", self.grammar)
        except IntdetError:
            raise
        except Exception as e:  # llguidance's parse errors (ValueError, RuntimeError)
            raise IntdetError(f"{f}: {_one_line(e)}", field=f) from None

    def field(self) -> str:
        """The field a compile error names: ``structured_outputs.<kind>``."""
        return f"structured_outputs.{self.kind()}"


def _one_line(e) -> str:
    """An llguidance message on one line, without the parser's state (the
    part from its first ``<state>`` / ``<non-verbose/>`` marker on)."""
    s = str(e)
    cut = min((i for i in (s.find("\n<"), s.find("<state>"), s.find("<non-verbose/>")) if i >= 0), default=len(s))
    lines = s[:cut].splitlines() or [""]
    # the regex crate's parse error: the reason is on its "error: " line, after a picture of the pattern
    why = next((ln.strip()[len("error: "):] for ln in lines if ln.strip().startswith("error: ")), None)
    if why and lines[0].rstrip().endswith("regex parse error:"):
        lines = [lines[0].rstrip()[:-len("regex parse error:")] + why]
    s = " ".join(" ".join(lines).split())
    return s[:300] + ("..." if len(s) > 300 else "")


_TOKENIZERS: dict = {}
_TOKENIZERS_LOCK = threading.Lock()


def grammar_tokenizer(tokenizer, eos_ids: Sequence[int]):
    """llguidance's view of a ``tokenizers.Tokenizer`` (each id's bytes),
    built once per tokenizer (~0.5 s for 49k ids) and shared."""
    llg = _llguidance()
    key = (id(tokenizer), tuple(eos_ids))
    with _TOKENIZERS_LOCK:
        hit = _TOKENIZERS.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
        try:
            lt = llg.LLTokenizer(tokenizer.to_str(), eos_token=list(eos_ids) or None)
        except Exception as e:  # noqa: BLE001  (a tokenizer llguidance cannot read)
            raise IntdetError(f"structured output: llguidance cannot read this model's tokenizer: {_one_line(e)}") \
                from None
        _TOKENIZERS[key] = (tokenizer, lt)  # holding the tokenizer keeps its id unique
        return lt


def _refuse_added_token_text(text: str, tokenizer, f: str) -> None:
    """IntdetError naming ``f`` when the grammar's source holds the text of
    one of the tokenizer's added tokens (``<|im_end|>``, ``<tool_call>``):
    llguidance's mask then offers that token where the text is due, but its
    parser wants the text's bytes and refuses the token, so the request
    would fail mid-generation (a 500) instead of at admission."""
    try:
        added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
    except AttributeError:  # not a tokenizers.Tokenizer: nothing to check
        return
    # the JSON's escapes, then a regex's (``<\|im_end\|>``), undone
    once = re.sub(r"\\(.)", r"\1", text)
    forms = (text, once, re.sub(r"\\(.)", r"\1", once))
    for tok in added:
        if len(tok) > 1 and any(tok in x for x in forms):
            raise IntdetError(f"{f}: holds {tok!r}, the text of a special token of this model, which its output "
                              "cannot spell as text; leave it out", field=f)


class Grammar:
    """A constraint compiled for one model's tokenizer, and checked: the
    library takes it, it allows a first token, and the parser can take that
    token. Otherwise IntdetError naming the field (``params.field()``) in a
    plain sentence: a schema or grammar the library cannot compile, one no
    output can match (a regex of no character, a schema that only refers to
    itself, JSON Schema's ``false``), one that can never end or is too
    complex for the library's limits (``parser_limits``). ``matcher()``
    gives each sequence its own state."""

    def __init__(self, params: StructuredOutputsParams, tokenizer, eos_ids: Sequence[int], vocab_size: int):
        llg = _llguidance()
        self.params = params
        self.vocab_size = int(vocab_size)
        self.tokenizer = grammar_tokenizer(tokenizer, eos_ids)
        self.eos_ids = tuple(int(t) for t in eos_ids)
        self.text = params.grammar_text()
        f = params.field()
        err = llg.LLMatcher.validate_grammar(self.text, self.tokenizer, limits=parser_limits())
        if err:
            raise IntdetError(f"{f}: {_one_line(err)}", field=f)
        _refuse_added_token_text(self.text, tokenizer, f)
        self._check_runs(f)

    def _check_runs(self, f: str) -> None:
        """The first mask allows a token and the parser takes one (the
        lowest allowed id that is not EOS) and computes the next mask: the
        errors llguidance would otherwise raise at the first token (in the
        library's own terms: no extension allowed, too many Earley items or
        lexer states) are found here, once per compile."""
        m = self._matcher()
        if m.is_error():
            raise IntdetError(f"{f}: {_one_line(m.get_error())}", field=f)
        allowed = _mask(m, self.vocab_size)
        if m.is_error() or not allowed.any():
            if m.is_error() and "NoExtensionBias" not in m.get_error():
                raise IntdetError(f"{f}: too complex for the structured-output engine", field=f)
            raise IntdetError(f"{f}: allows no output (no token can begin it)", field=f)
        ids = [t for t in np.flatnonzero(allowed).tolist() if t not in self.eos_ids]
        if not ids:  # only the empty output: the grammar is done at once
            return
        ok = m.consume_token(ids[0])
        if ok and not m.is_stopped():
            _mask(m, self.vocab_size)
            ok = not m.is_error()
        if not ok:
            raise IntdetError(f"{f}: cannot be run: it never ends, or it is too complex for the structured-output "
                              "engine", field=f)

    def _matcher(self):
        return _llguidance().LLMatcher(self.tokenizer, self.text, log_level=0, limits=parser_limits())

    def matcher(self) -> "GrammarState":
        return GrammarState(self)


def _mask(m, vocab_size: int) -> np.ndarray:
    """bool [vocab_size]: the ids matcher ``m`` allows next (ids the
    tokenizer lacks are never allowed)."""
    bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")
    if len(bits) < vocab_size:
        bits = np.concatenate([bits, np.zeros(vocab_size - len(bits), dtype=np.uint8)])
    return bits[:vocab_size].astype(bool)


class GrammarState:
    """One sequence's place in the grammar.

    ``allowed()``: bool [vocab_size], the ids that may come next (ids the
    tokenizer lacks are never allowed); ``advance(id)``: take the chosen id
    (IntdetError if the grammar refuses it); ``done``: the grammar can take
    nothing more (the output is complete).
    """

    def __init__(self, grammar: Grammar):
        self.vocab_size = grammar.vocab_size
        self._m = grammar._matcher()
        # the next allowed() (or its IntdetError), computed ahead by prefetch()
        self._next: np.ndarray | IntdetError | None = None
        if self._m.is_error():
            raise IntdetError(f"structured_outputs: {_one_line(self._m.get_error())}", field="structured_outputs")

    def prefetch(self) -> None:
        """Compute the next ``allowed()`` now (the scheduler calls it in a
        worker thread while the forward call runs: llguidance releases the
        GIL, as the forward does)."""
        if self._next is None:
            try:
                self._next = self._allowed()
            except IntdetError as e:
                self._next = e

    def allowed(self) -> np.ndarray:
        nxt, self._next = self._next, None
        if isinstance(nxt, IntdetError):
            raise nxt
        return nxt if nxt is not None else self._allowed()

    def _allowed(self) -> np.ndarray:
        allowed = _mask(self._m, self.vocab_size)
        if self._m.is_error():
            raise IntdetError(f"structured output: {_one_line(self._m.get_error())}")
        return allowed

    def advance(self, token: int) -> None:
        self._next = None
        if not self._m.consume_token(int(token)):
            raise IntdetError(f"structured output: the grammar refused token {int(token)}: "
                              f"{_one_line(self._m.get_error())}")

    @property
    def done(self) -> bool:
        return self._m.is_stopped()


def structured_from_any(value: Any, field: str = "structured_outputs") -> Optional[Union[StructuredOutputsParams, Grammar]]:
    """None, a ``StructuredOutputsParams``, a compiled ``Grammar`` (kept as
    it is) or a dict of its fields (the server's and the JSON API's shape)."""
    if value is None or isinstance(value, (StructuredOutputsParams, Grammar)):
        return value
    if not isinstance(value, dict):
        raise IntdetError(f"{field}: must be an object with one of {', '.join(KINDS)}", field=field)
    unknown = sorted(set(value) - set(KINDS))
    if unknown:
        raise IntdetError(f"{field}.{unknown[0]}: unknown field (choose one of {', '.join(KINDS)})",
                          field=f"{field}.{unknown[0]}")
    return StructuredOutputsParams(**value)
