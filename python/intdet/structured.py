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
import threading
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import numpy as np

from .errors import IntdetError

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
KINDS = ("json", "json_object", "regex", "choice", "grammar")


def _llguidance():
    try:
        import llguidance
    except ImportError:  # a dependency of intdet; only a broken install lacks it
        raise IntdetError("structured output needs llguidance: pip install 'intdet[structured]'") from None
    return llguidance


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

    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def check(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise IntdetError(f"structured_outputs: set exactly one of {', '.join(KINDS)} "
                              f"(got {', '.join(given) or 'none'})", field="structured_outputs")
        k = given[0]
        v = getattr(self, k)
        f = f"structured_outputs.{k}"
        if k == "json" and not isinstance(v, (dict, str)):
            raise IntdetError(f"{f}: must be a JSON schema (an object or its JSON text)", field=f)
        if k == "json_object" and v is not True:
            raise IntdetError(f"{f}: must be true or false", field=f)
        if k in ("regex", "grammar") and (not isinstance(v, str) or not v.strip()):
            raise IntdetError(f"{f}: must be a non-empty string", field=f)
        if k == "choice" and (isinstance(v, str) or not isinstance(v, (list, tuple)) or not v
                              or not all(isinstance(c, str) and c for c in v)):
            raise IntdetError(f"{f}: must be a non-empty list of non-empty strings", field=f)

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


def _one_line(e) -> str:
    s = " ".join(str(e).split())
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


class Grammar:
    """A constraint compiled for one model's tokenizer (checked: a bad
    schema or grammar raises IntdetError naming the field). ``matcher()``
    gives each sequence its own state."""

    def __init__(self, params: StructuredOutputsParams, tokenizer, eos_ids: Sequence[int], vocab_size: int):
        llg = _llguidance()
        self.params = params
        self.vocab_size = int(vocab_size)
        self.tokenizer = grammar_tokenizer(tokenizer, eos_ids)
        self.text = params.grammar_text()
        f = f"structured_outputs.{params.kind()}"
        err = llg.LLMatcher.validate_grammar(self.text, self.tokenizer)
        if err:
            raise IntdetError(f"{f}: {_one_line(err)}", field=f)

    def matcher(self) -> "GrammarState":
        return GrammarState(self)


class GrammarState:
    """One sequence's place in the grammar.

    ``allowed()``: bool [vocab_size], the ids that may come next (ids the
    tokenizer lacks are never allowed); ``advance(id)``: take the chosen id
    (IntdetError if the grammar refuses it); ``done``: the grammar can take
    nothing more (the output is complete).
    """

    def __init__(self, grammar: Grammar):
        llg = _llguidance()
        self.vocab_size = grammar.vocab_size
        self._m = llg.LLMatcher(grammar.tokenizer, grammar.text, log_level=0)
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
        bits = np.unpackbits(np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8), bitorder="little")
        if self._m.is_error():
            raise IntdetError(f"structured output: {_one_line(self._m.get_error())}")
        v = self.vocab_size
        if len(bits) < v:
            bits = np.concatenate([bits, np.zeros(v - len(bits), dtype=np.uint8)])
        return bits[:v].astype(bool)

    def advance(self, token: int) -> None:
        self._next = None
        if not self._m.consume_token(int(token)):
            raise IntdetError(f"structured output: the grammar refused token {int(token)}: "
                              f"{_one_line(self._m.get_error())}")

    @property
    def done(self) -> bool:
        return self._m.is_stopped()


def structured_from_any(value: Any, field: str = "structured_outputs") -> Optional[StructuredOutputsParams]:
    """None, a ``StructuredOutputsParams`` or a dict of its fields (the
    server's and the JSON API's shape)."""
    if value is None or isinstance(value, StructuredOutputsParams):
        return value
    if not isinstance(value, dict):
        raise IntdetError(f"{field}: must be an object with one of {', '.join(KINDS)}", field=field)
    unknown = sorted(set(value) - set(KINDS))
    if unknown:
        raise IntdetError(f"{field}.{unknown[0]}: unknown field (choose one of {', '.join(KINDS)})",
                          field=f"{field}.{unknown[0]}")
    return StructuredOutputsParams(**value)
