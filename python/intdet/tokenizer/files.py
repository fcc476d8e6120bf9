"""Write a tokenizer and its meta dict to a directory, and read one back (ours, or a
Hugging Face checkpoint's)."""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

from tokenizers import Tokenizer

from .hf import _post_processor_bos, _read_json, meta_from_hf_dir


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
