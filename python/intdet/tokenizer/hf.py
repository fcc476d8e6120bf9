"""The meta dict of a Hugging Face checkpoint directory, from its JSON files
(tokenizer_config.json, tokenizer.json, generation_config.json, config.json,
chat templates)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .meta import _EOG_TOKEN_TEXTS, _eos_list


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
