"""Tokenizers for intdet: rebuilt from a GGUF vocab or read from a Hugging Face checkpoint.

Everything here works on plain Python values: token ids are ``list[int]``, text is
``str``, and tokenizer metadata ("meta") is a JSON-serialisable ``dict`` with:

* ``bos_token_id`` / ``eos_token_id``: ``int`` or ``None``
* ``bos_token`` / ``eos_token``: the token strings (``str`` or ``None``), for chat templates
* ``add_bos_token``: ``bool``, whether a prompt starts with BOS (added by :func:`encode`,
  never by the tokenizer's post-processor)
* ``chat_template``: ``str`` or ``None``
* ``eos_token_ids``: ``list[int]``, every id that ends generation (EOS first)
"""

from __future__ import annotations

import ctypes
import datetime
import functools
import json
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

import gguf
import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
)

from .errors import IntdetError
from .tokenizer_spm import sentencepiece_bpe

__all__ = [
    "StreamDecoder", "encode", "load_tokenizer", "meta_from_hf_dir", "render_chat",
    "save_tokenizer", "tokenizer_from_gguf",
]

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Control tokens that end a turn in common chat formats; llama.cpp treats them as
# end-of-generation even when the GGUF only names one EOS id.
_EOG_TOKEN_TEXTS = (
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>",
    "<end_of_turn>", "<|end|>",
)

# Pre-tokenizer regexes, after llama.cpp's src/llama-vocab.cpp (llm_tokenizer_bpe).
# llama.cpp splits with each regex in turn, keeping both matches and the gaps between
# them; a chain of Split(..., "isolated") pre-tokenizers does the same. llama.cpp spells
# the case-insensitive contractions out because its regex engine lacks (?i:); Oniguruma
# (used by `tokenizers`) has it, so the upstream tokenizer.json forms are used.
_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEFAULT_RES = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_RE, r"\p{N}+", r"[0-9][0-9][0-9]")

_PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "default": _DEFAULT_RES,
    **dict.fromkeys(("gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais"), (_GPT2_RE,)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"),
                    (r"\p{N}", _GPT2_RE)),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe",
                     "chatglm-bpe", "glm4"), (_LLAMA3_RE,)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2"), (_QWEN2_RE,)),
}
# llama.cpp: these pre-tokenizers also skip BPE when a whole word is in the vocab,
# and their models want a BOS by default.
_LLAMA3_FAMILY = frozenset(("llama3", "llama-v3", "llama-bpe", "falcon3"))

# --------------------------------------------------------------------------- GGUF


def tokenizer_from_gguf(reader: gguf.GGUFReader | str | os.PathLike) -> tuple[Tokenizer, dict]:
    """Rebuild a Hugging Face fast tokenizer from the vocabulary stored in a GGUF file.

    Args:
        reader: an open ``gguf.GGUFReader`` (or a path to a ``.gguf`` file).

    Returns:
        ``(tokenizer, meta)``: a ``tokenizers.Tokenizer`` with no post-processor (BOS is
        the caller's job, see :func:`encode`) and the meta dict described in the module
        docstring. Control tokens (GGUF type 3) become special added tokens, user-defined
        tokens (type 4) plain added tokens; both are matched whole in text, but
        :func:`encode` only honours control tokens when ``special=True`` (as llama.cpp).

    Supported ``tokenizer.ggml.model`` values: ``"gpt2"`` (byte-level BPE with merges;
    the pre-tokenizer follows ``tokenizer.ggml.pre``) and ``"llama"`` (SentencePiece
    BPE from scores, with byte fallback, as llama.cpp tokenizes it: see
    :mod:`intdet.tokenizer_spm`; Llama 2, Gemma 3).

    Raises:
        ValueError: unsupported tokenizer model or pre-tokenizer, missing or inconsistent
            vocab arrays (token/type/score lengths, non-finite scores), malformed merges, or
            special-token ids outside the vocab.
    """
    if not isinstance(reader, gguf.GGUFReader):
        reader = gguf.GGUFReader(os.fspath(reader))
    kind = _kv(reader, "tokenizer.ggml.model")
    tokens = _kv(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError("GGUF has no tokenizer.ggml.tokens")
    types = _kv(reader, "tokenizer.ggml.token_type")
    if types is None:  # llama.cpp treats a missing type array as all-normal
        types = [TOKEN_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(f"GGUF token_type has {len(types)} entries but tokens has {len(tokens)}")

    if kind == "gpt2":
        pre = _kv(reader, "tokenizer.ggml.pre") or "default"
        merges = _kv(reader, "tokenizer.ggml.merges")
        if merges is None:
            raise ValueError("GGUF 'gpt2' tokenizer has no tokenizer.ggml.merges")
        tok = _byte_level_bpe(tokens, merges, pre)
        default_add_bos = pre in _LLAMA3_FAMILY
        default_bos = default_eos = None
    elif kind == "llama":
        tok = _sentencepiece_bpe(reader, tokens, types)
        default_add_bos, default_bos, default_eos = True, 1, 2  # llama.cpp's SPM defaults
    else:
        raise ValueError(f"unsupported GGUF tokenizer model {kind!r}")
    _add_special_tokens(tok, tokens, types)

    add_bos = _kv(reader, "tokenizer.ggml.add_bos_token")
    meta = _gguf_meta(
        reader, tokens, types,
        bos=_kv(reader, "tokenizer.ggml.bos_token_id", default_bos),
        eos=_kv(reader, "tokenizer.ggml.eos_token_id", default_eos),
        add_bos=default_add_bos if add_bos is None else bool(add_bos),
    )
    return tok, meta


def _kv(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    try:
        return field.contents()
    except UnicodeDecodeError:
        raise ValueError(f"GGUF {key} holds invalid UTF-8") from None


def _first_ids(tokens: list[str]) -> dict[str, int]:
    """Token text -> id. Some vocabularies repeat a string; the first id wins, as in llama.cpp's
    text-to-token lookup, and later duplicates can still be decoded through their own id."""
    vocab: dict[str, int] = {}
    for i, text in enumerate(tokens):
        vocab.setdefault(text, i)
    return vocab


def _parse_merges(merges: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    pairs = []
    for rank, merge in enumerate(merges):
        # Split at the first space after position 0, like llama.cpp (a token may start with one).
        cut = merge.find(" ", 1) if isinstance(merge, str) else -1
        left, right = (merge[:cut], merge[cut + 1:]) if cut > 0 else ("", "")
        if not left or not right:
            raise ValueError(f"malformed GGUF merge #{rank}: {merge!r} (want 'left right')")
        for part in (left, right, left + right):
            if part not in vocab:
                raise ValueError(f"GGUF merge #{rank} {merge!r}: {part!r} is not in the vocab")
        pairs.append((left, right))
    return pairs


def _byte_level_bpe(tokens: list[str], merges: list[str], pre: str) -> Tokenizer:
    if pre not in _PRE_REGEXES:
        raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}")
    vocab = _first_ids(tokens)
    model = models.BPE(vocab=vocab, merges=_parse_merges(merges, vocab),
                       ignore_merges=pre in _LLAMA3_FAMILY)
    tok = Tokenizer(model)
    splits = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in _PRE_REGEXES[pre]]
    # The regexes already split the text, so ByteLevel only maps bytes to its alphabet.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(reader: gguf.GGUFReader, tokens: list[str], types: list[int]) -> Tokenizer:
    scores = _kv(reader, "tokenizer.ggml.scores")
    if scores is None:
        raise ValueError(f"GGUF 'llama' tokenizer needs tokenizer.ggml.scores with {len(tokens)} entries")
    return sentencepiece_bpe(tokens, types, scores, unk_id=_kv(reader, "tokenizer.ggml.unknown_token_id", 0),
                             add_space_prefix=bool(_kv(reader, "tokenizer.ggml.add_space_prefix", True)))


def _add_special_tokens(tok: Tokenizer, tokens: list[str], types: list[int]) -> None:
    # GGUF stores control and user-defined tokens as raw text (not in the byte-level
    # alphabet), which is what added tokens match against. Caveat: `tokenizers` still runs
    # them through the decoder, so such a token containing a character of the byte-level
    # alphabet beyond ASCII (e.g. "ö") decodes wrongly; real vocabularies rarely have one.
    control, user = [], []
    for text, kind in zip(tokens, types):
        if text and kind == TOKEN_CONTROL:
            control.append(AddedToken(text, special=True, normalized=False))
        elif text and kind == TOKEN_USER_DEFINED:
            user.append(AddedToken(text, special=False, normalized=False))
    if control:
        tok.add_special_tokens(control)
    if user:
        tok.add_tokens(user)


def _gguf_meta(reader: gguf.GGUFReader, tokens: list[str], types: list[int],
               bos: int | None, eos: int | None, add_bos: bool) -> dict:
    def checked(token_id: int | None, what: str) -> int | None:
        if token_id is not None and not 0 <= int(token_id) < len(tokens):
            raise ValueError(f"GGUF {what} id {token_id} is outside the vocab (size {len(tokens)})")
        return None if token_id is None else int(token_id)

    bos, eos = checked(bos, "BOS"), checked(eos, "EOS")
    extra = [checked(_kv(reader, f"tokenizer.ggml.{k}_token_id"), k.upper()) for k in ("eot", "eom")]
    extra += [i for i, (text, kind) in enumerate(zip(tokens, types))
              if kind == TOKEN_CONTROL and text in _EOG_TOKEN_TEXTS]
    return {
        "bos_token_id": bos,
        "eos_token_id": eos,
        "bos_token": None if bos is None else tokens[bos],
        "eos_token": None if eos is None else tokens[eos],
        "add_bos_token": add_bos,
        "chat_template": _kv(reader, "tokenizer.chat_template"),
        "eos_token_ids": _eos_list(eos, extra),
    }


def _eos_list(eos: int | None, extra: list[int | None]) -> list[int]:
    """EOS first, then the other end-of-generation ids ascending, without repeats."""
    rest = sorted({int(i) for i in extra if i is not None} - {eos})
    return ([eos] if eos is not None else []) + rest


# --------------------------------------------------------------------------- files


def save_tokenizer(tok: Tokenizer, meta: dict, out_dir: str | os.PathLike) -> None:
    """Write ``out_dir/tokenizer.json`` (``tok.to_str()``) and ``out_dir/tokenizer_config.json``
    (the meta dict, sorted keys, 2-space indent). Output bytes depend only on the inputs.

    Raises:
        OSError: the directory or files cannot be written.
        TypeError: ``meta`` is not JSON-serialisable.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = json.dumps(meta, sort_keys=True, indent=2)  # before writing anything
    (out / "tokenizer.json").write_bytes(tok.to_str().encode("utf-8"))
    (out / "tokenizer_config.json").write_bytes(config.encode("utf-8"))


def load_tokenizer(path: str | os.PathLike) -> tuple[Tokenizer, dict]:
    """Load ``(Tokenizer, meta)`` from a directory written by :func:`save_tokenizer` or from a
    Hugging Face checkpoint directory (meta then comes from :func:`meta_from_hf_dir`).
    A post-processor that inserts BOS is removed, so BOS only ever comes from
    ``meta['add_bos_token']`` via :func:`encode`, even for direct ``tok.encode`` calls.

    Raises:
        FileNotFoundError: no ``tokenizer.json`` in the directory.
        ValueError: malformed JSON or a tokenizer.json that `tokenizers` rejects.
    """
    root = Path(path)
    if not (root / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {root}")
    # Only the post-processor is needed from the Python parse; dropping the
    # parse and the text before the library reads the file itself keeps them
    # off the peak (Gemma 3's 14 MB tokenizer.json: ~190 MiB as Python objects).
    post_bos = _post_processor_bos(_read_json(root / "tokenizer.json").get("post_processor"))
    try:
        tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    except Exception as err:  # tokenizers raises a bare Exception
        raise ValueError(f"{root / 'tokenizer.json'}: {str(err).splitlines()[0]}") from None
    _release_free_heap()
    if post_bos is not None:
        tok.post_processor = None
    config = _read_json(root / "tokenizer_config.json")
    meta = config if "eos_token_ids" in config else meta_from_hf_dir(root)  # ours, or HF's
    return tok, meta


def _release_free_heap() -> None:
    """Return the C heap's free memory to the OS (glibc ``malloc_trim``; a
    no-op elsewhere). Deserializing a large tokenizer.json leaves most of
    its transient allocations free but resident: 275 MiB of Gemma 3's
    ~390 MiB after ``Tokenizer.from_file`` (its 262,144-token vocabulary and
    514,847 merges), which would otherwise count in the process's RSS for
    its whole life."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # musl and others: no malloc_trim
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)


def _read_json(path: Path) -> dict:
    return _parse_json(path.read_text(encoding="utf-8"), path) if path.is_file() else {}


def _parse_json(text: str, path: Path) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON ({err})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return value


def meta_from_hf_dir(path: str | os.PathLike) -> dict:
    """Build the meta dict for a Hugging Face checkpoint directory.

    Reads ``tokenizer_config.json`` (token strings, ``add_bos_token``, ``chat_template``,
    ``added_tokens_decoder``), ``chat_template.jinja``, ``tokenizer.json`` (token ids and the
    post-processor), ``generation_config.json`` and ``config.json`` (``bos_token_id``,
    ``eos_token_id`` as int or list). ``add_bos_token`` is True when the config says so or
    the post-processor inserts BOS; :func:`encode` never runs the post-processor and
    :func:`load_tokenizer` strips it, so BOS is added exactly once.

    Raises:
        ValueError: a JSON file is malformed.
    """
    root = Path(path)
    config = _read_json(root / "tokenizer_config.json")
    tok_json = _read_json(root / "tokenizer.json")
    ids = _hf_token_ids(config, tok_json)
    gen = _read_json(root / "generation_config.json")
    model = _read_json(root / "config.json")

    def token_text(key: str) -> str | None:
        value = config.get(key)
        return value.get("content") if isinstance(value, dict) else value

    def token_id(key: str) -> int | None:
        text = token_text(key)
        if text in ids:
            return ids[text]
        for source in (gen, model):
            value = source.get(f"{key}_id")
            if isinstance(value, list):
                value = value[0] if value else None
            if value is not None:
                return int(value)
        return None

    bos, eos = token_id("bos_token"), token_id("eos_token")
    post_bos = _post_processor_bos(tok_json.get("post_processor"))
    if bos is None and post_bos is not None:
        bos = ids.get(post_bos)
    id_to_text = {i: t for t, i in ids.items()}
    special = set(_hf_special_texts(config, tok_json))
    extra = [ids[t] for t in _EOG_TOKEN_TEXTS if t in special and t in ids]
    for source in (gen, model):
        value = source.get("eos_token_id")
        extra += value if isinstance(value, list) else [value]
    return {
        "bos_token_id": bos,
        "eos_token_id": eos,
        "bos_token": token_text("bos_token") or id_to_text.get(bos),
        "eos_token": token_text("eos_token") or id_to_text.get(eos),
        "add_bos_token": config.get("add_bos_token") is True or post_bos is not None,
        "chat_template": _hf_chat_template(root, config),
        "eos_token_ids": _eos_list(eos, extra),
    }


def _hf_token_ids(config: dict, tok_json: dict) -> dict[str, int]:
    ids = {}
    for key, value in (config.get("added_tokens_decoder") or {}).items():
        ids[value["content"]] = int(key)
    model_vocab = (tok_json.get("model") or {}).get("vocab")
    if isinstance(model_vocab, dict):
        ids.update(model_vocab)
    for added in tok_json.get("added_tokens") or []:
        ids[added["content"]] = added["id"]
    return ids


def _hf_special_texts(config: dict, tok_json: dict) -> list[str]:
    texts = [v["content"] for v in (config.get("added_tokens_decoder") or {}).values() if v.get("special")]
    return texts + [a["content"] for a in tok_json.get("added_tokens") or [] if a.get("special")]


def _hf_chat_template(root: Path, config: dict) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}]: take the default one
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default")
    if template is None and (root / "chat_template.jinja").is_file():
        template = (root / "chat_template.jinja").read_text(encoding="utf-8")
    if template is None:  # older processor-style checkpoints
        template = _read_json(root / "chat_template.json").get("chat_template")
    return template


def _post_processor_bos(proc: dict | None) -> str | None:
    """The token a tokenizer.json post-processor puts first in a single sequence, if any."""
    if not proc:
        return None
    if proc.get("type") == "Sequence":
        found = [_post_processor_bos(p) for p in proc.get("processors", [])]
        return next((f for f in found if f is not None), None)
    if proc.get("type") == "TemplateProcessing":
        first = (proc.get("single") or [{}])[0]
        return (first.get("SpecialToken") or {}).get("id")
    return None


# --------------------------------------------------------------------------- encode


# encode() flips Tokenizer.encode_special_tokens for one call; the lock keeps threads that
# share a tokenizer from seeing each other's setting.
_ENCODE_LOCK = threading.Lock()


def check_text(text: str, what: str = "text") -> None:
    """IntdetError naming ``what`` when ``text`` cannot be UTF-8: a lone
    surrogate code point (JSON allows "\\ud800"), or a byte of a command-line
    argument that was not UTF-8 (Python carries it as a surrogate escape,
    U+DC80..U+DCFF). The tokenizer takes text only."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        c = ord(text[e.start])
        if 0xDC80 <= c <= 0xDCFF:
            at = len(text[:e.start].encode("utf-8", "surrogateescape"))
            raise IntdetError(f"{what}: not valid UTF-8 (byte {at})") from None
        raise IntdetError(f"{what}: character {e.start} is a lone surrogate (U+{c:04X}), not text") from None


def encode(tok: Tokenizer, meta: dict, text: str, add_bos: bool | None = None,
           special: bool = False, what: str = "text") -> list[int]:
    """Tokenize ``text`` into ``list[int]``.

    Args:
        tok, meta: from :func:`tokenizer_from_gguf` or :func:`load_tokenizer`.
        text: the text; with ``special=False`` (default) special-token strings in it such as
            ``"<|im_end|>"`` are tokenized as plain text, so user input cannot inject control
            tokens. ``special=True`` matches them as single tokens (for rendered chat prompts).
        add_bos: prepend ``meta['bos_token_id']``; default ``meta['add_bos_token']``.

        what: the name an error gives ``text`` (check_text).

    Raises:
        TypeError: ``text`` is not a ``str``.
        IntdetError: ``text`` is not valid Unicode (check_text).
        ValueError: BOS requested but the model has none.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, not {type(text).__name__}")
    if add_bos is None:
        add_bos = bool(meta.get("add_bos_token"))
    with _ENCODE_LOCK:
        before = tok.encode_special_tokens
        tok.encode_special_tokens = not special  # True = treat special tokens as text
        try:
            ids = tok.encode(text, add_special_tokens=False).ids
        except TypeError:  # tokenizers refuses text that is not UTF-8: name it (checked only then)
            check_text(text, what)
            raise
        finally:
            tok.encode_special_tokens = before
    if not add_bos:
        return ids
    if meta.get("bos_token_id") is None:
        raise ValueError("BOS requested but the model has no bos_token_id")
    return [int(meta["bos_token_id"])] + ids


# --------------------------------------------------------------------------- chat


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
                    add_generation_prompt: bool = True) -> list[int]:
    """Token ids of a chat (``[{"role", "content"}, ...]``) rendered by the
    model's template, ending with the generation prompt.

    As in transformers' ``apply_chat_template``, the template sees the real
    contents (it may trim them or look inside them) and its output is
    tokenized as one text, so tokens that span a content's edges come out as
    they would there. Unlike there, a special-token string typed inside a
    content ("<|im_end|>") cannot become a control token: it is swapped for a
    private marker before rendering, and each marker is encoded as the plain
    text of its string. BOS is added when meta asks for it and the template
    did not write it. Raises what :func:`render_chat` raises, and IntdetError
    naming ``messages[i].content`` for text that is not valid Unicode.
    """
    contents = [m.get("content") if isinstance(m, dict) else None for m in messages] if isinstance(
        messages, list) else []
    for i, c in enumerate(contents):
        if isinstance(c, str):
            check_text(c, f"messages[{i}].content")
    specials = sorted({t.content for t in tok.get_added_tokens_decoder().values() if t.special}, key=len,
                      reverse=True)
    typed: list[str] = []  # the special-token strings found in contents, by marker number
    if specials and any(isinstance(c, str) for c in contents):
        n = 0  # a marker prefix no content holds
        while any(isinstance(c, str) and f"\x00intdet-{n}-" in c for c in contents):
            n += 1
        prefix, found = f"\x00intdet-{n}-", re.compile("|".join(map(re.escape, specials)))

        def swap(match):
            typed.append(match.group(0))
            return f"{prefix}{len(typed) - 1}\x00"

        messages = [dict(m, content=found.sub(swap, m["content"])) if isinstance(c, str) else m
                    for m, c in zip(messages, contents)]
    rendered = render_chat(meta, messages, add_generation_prompt=add_generation_prompt)
    bos = meta.get("bos_token")
    add_bos = bool(meta.get("add_bos_token")) and not (bos and rendered.startswith(bos))
    if not typed:
        return encode(tok, meta, rendered, add_bos=add_bos, special=True)
    pieces = re.split(f"{re.escape(prefix)}(\\d+)\x00", rendered)
    ids = encode(tok, meta, pieces[0], add_bos=add_bos, special=True)
    for j in range(1, len(pieces), 2):
        ids += encode(tok, meta, typed[int(pieces[j])], add_bos=False)  # plain text
        ids += encode(tok, meta, pieces[j + 1], add_bos=False, special=True)
    return ids


# --------------------------------------------------------------------------- streaming


class StreamDecoder:
    """Incremental detokenizer: feed generated ids one at a time, get printable text.

    The chunking is ``tokenizers.decoders.DecodeStream``'s: a byte-level or
    byte-fallback token can hold part of a UTF-8 character, and DecodeStream
    holds text back while it ends in U+FFFD, so no character is split between
    chunks; it decodes only a short window of recent ids, so each step is
    cheap. The concatenation of all ``push`` results plus ``flush()`` equals
    ``tok.decode(all_ids)``. Kept here, because DecodeStream lacks them:

    * ``flush()``: DecodeStream never releases a character left incomplete at
      the end (generation stopped inside it), which ``tok.decode`` shows as
      U+FFFD; flush decodes all ids once and returns what is still owed.
    * the vocab check: DecodeStream decodes an unknown id as no text at all.
    * a fallback for decoders whose text is not prefix-stable (one rewriting
      text across token boundaries, e.g. Replace("ab", "X")): DecodeStream
      raises on them, which must not end a generation, so from then on each
      step decodes all ids and returns the new stable text.

    Args:
        tok: the ``tokenizers.Tokenizer`` that produced the ids.
        skip_special_tokens: drop special tokens from the text (default: show them).
    """

    def __init__(self, tok: Tokenizer, skip_special_tokens: bool = False):
        self._tok = tok
        self._skip = skip_special_tokens
        self._stream = decoders.DecodeStream(skip_special_tokens=skip_special_tokens)  # None: fallen back
        self._ids: list[int] = []  # every id pushed since the last flush
        self._emitted = 0          # chars of decode(self._ids) already returned

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def push(self, token_id: int) -> str:
        """Add one id (``int``); return the newly completed text (``str``, maybe empty).

        Raises:
            ValueError: ``token_id`` is not in the tokenizer's vocab.
        """
        token_id = int(token_id)
        if token_id < 0 or self._tok.id_to_token(token_id) is None:
            raise ValueError(f"token id {token_id} is not in the vocab")
        self._ids.append(token_id)
        if self._stream is not None:
            try:
                out = self._stream.step(self._tok, token_id) or ""
                self._emitted += len(out)
                return out
            except Exception:  # tokenizers raises a bare Exception (InvalidPrefix)
                self._stream = None
        text = self._decode(self._ids)
        stable = len(text.rstrip("\ufffd"))
        out = text[self._emitted:stable]
        self._emitted = max(self._emitted, stable)
        return out

    def flush(self) -> str:
        """Return everything not yet returned (``str``, may end in U+FFFD for a truncated
        character) and reset the decoder."""
        out = self._decode(self._ids)[self._emitted:]
        self.__init__(self._tok, self._skip)
        return out
