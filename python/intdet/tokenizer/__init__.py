"""Tokenizers for intdet: rebuilt from a GGUF vocab or read from a Hugging Face checkpoint.

Everything here works on plain Python values: token ids are ``list[int]``, text is
``str``, and tokenizer metadata ("meta") is a JSON-serialisable ``dict`` with:

* ``bos_token_id`` / ``eos_token_id``: ``int`` or ``None``
* ``bos_token`` / ``eos_token``: the token strings (``str`` or ``None``), for chat templates
* ``add_bos_token``: ``bool``, whether a prompt starts with BOS (added by :func:`encode`,
  never by the tokenizer's post-processor)
* ``chat_template``: ``str`` or ``None``
* ``eos_token_ids``: ``list[int]``, every id that ends generation (EOS first)

One module per job; import the names from ``intdet.tokenizer``:

* gguf.py: :func:`tokenizer_from_gguf`, a tokenizer and its meta from a GGUF vocab
  (byte-level BPE there)
* spm.py: SentencePiece vocabularies (Llama 2, Gemma 3) as llama.cpp tokenizes them
* hf.py: :func:`meta_from_hf_dir`, the meta of a Hugging Face checkpoint
* meta.py: the end-of-generation ids both readers list
* files.py: :func:`save_tokenizer` and :func:`load_tokenizer`
* text.py: :func:`encode` and :func:`check_text`
* chat.py: jinja chat templates, :func:`render_chat`, :func:`encode_chat`, :func:`encode_messages`
* stream.py: :class:`StreamDecoder`, ids to text while they are generated
"""

from __future__ import annotations

# the names other modules import from intdet.tokenizer (not all in __all__)
from .chat import encode_chat, encode_messages, render_chat  # noqa: F401
from .files import load_tokenizer, save_tokenizer
from .gguf import (  # noqa: F401
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_UNUSED,
    TOKEN_USER_DEFINED,
    tokenizer_from_gguf,
)
from .hf import meta_from_hf_dir
from .spm import sentencepiece_bpe  # noqa: F401
from .stream import StreamDecoder
from .text import check_text, encode  # noqa: F401

__all__ = [
    "StreamDecoder", "encode", "load_tokenizer", "meta_from_hf_dir", "render_chat",
    "save_tokenizer", "tokenizer_from_gguf",
]
