"""intdet compress / decompress on tiny random models: round trips of every
kind of input, identical bytes across batch sizes, thread counts and kernel
sets, and the container's checks (corrupt, truncated, wrong model)."""

import io
import json
import os
import signal
import subprocess
import sys
import time

import models
import numpy as np
import pytest
from conftest import ISAS, using_isa

from intdet.compress import codec
from intdet.compress.chunking import TokenBytes, chunks
from intdet.compress.container import read_header
from intdet.convert import convert
from intdet.errors import IntdetError
from intdet.model import Engine, load_model

TEXT = ("The quick brown fox jumps over the lazy dog. Integer arithmetic is exact; "
        "floating point is not.\n") * 6


@pytest.fixture(scope="module")
def tiny(tiny_llama_hf, tmp_path_factory):
    return convert(tiny_llama_hf, str(tmp_path_factory.mktemp("cz") / "m"), progress=False)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread: on this shared 2-core machine OpenMP barriers at 2 threads
    cost more than the tiny model's work (the thread count cannot change a
    byte; test_identical_bytes_any_batch_threads_isa runs 2 as well)."""
    from intdet import _core

    n0 = _core.num_threads()
    _core.set_num_threads(1)
    yield
    _core.set_num_threads(n0)


@pytest.fixture(scope="module")
def eng(tiny):
    return Engine(load_model(tiny))


def comp(eng, data: bytes, ctx=64, store=False) -> tuple[bytes, codec.Stats]:
    """The random tiny models do not beat raw bytes, so by default every
    chunk that can be is kept range-coded (store=False)."""
    out = io.BytesIO()
    st = codec.compress_stream(eng, io.BytesIO(data).read, out, ctx=ctx, store_larger=store)
    return out.getvalue(), st


def decomp(eng, blob: bytes, batch=8) -> bytes:
    out = io.BytesIO()
    codec.decompress_stream(eng, io.BytesIO(blob), out, "x.idz", batch=batch)
    return out.getvalue()


def noise(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


CASES = {
    "empty": b"",
    "one byte": b"a",
    "one high byte": b"\xff",
    "repeated char": b"e" * 1500,
    "binary noise": noise(1000),
    "latin-1 text": "Ça a été très déjà vu, naïve façade. ".encode("latin-1") * 20,
    "utf-8 mixed": ("héllo wörld ✓ 漢字 🙂\r\n\t" * 30).encode(),
    "text then noise": TEXT.encode() + noise(500, 1) + TEXT.encode(),
    "cut utf-8 at the end": "ab✓".encode()[:-1],
    "nul bytes": b"\0" * 100 + b"x" + b"\0" * 100,
}


@pytest.mark.parametrize("name", list(CASES))
def test_round_trip(eng, name):
    data = CASES[name]
    blob, st = comp(eng, data)
    assert decomp(eng, blob) == data
    assert st.in_bytes == len(data) and st.out_bytes == len(blob)
    h = read_header(io.BytesIO(blob), "x")
    assert h.orig_len == len(data) and h.n_chunks == st.chunks
    assert st.stored_chunks == 0 or name == "empty"


def test_stored_when_not_smaller(eng):
    """With the default rule a chunk the model cannot shrink is kept as
    bytes (binary noise; the tiny random model on anything)."""
    data = noise(1500)
    blob, st = comp(eng, data, store=True)
    assert st.stored_chunks == st.chunks > 1 and len(blob) < len(data) + 21 * st.chunks + 200
    assert decomp(eng, blob) == data
    blob2, st2 = comp(eng, data, store=False)
    assert st2.stored_chunks == 0 and len(blob2) > len(blob) and decomp(eng, blob2) == data


def test_decoder_checks_the_decoded_bytes(eng):
    """A payload changed with its record CRC recomputed gets past the
    container checks; the decoder or the chunk checksum still catch it."""
    from intdet.compress.container import Chunk, read_chunk

    blob, _ = comp(eng, TEXT[:200].encode(), ctx=256)
    f = io.BytesIO(blob)
    h = read_header(f, "x")
    start = f.tell()
    c = read_chunk(f, h, 0, "x")
    for k in (0, len(c.payload) // 2, len(c.payload) - 1):
        p = bytearray(c.payload)
        p[k] ^= 0x10
        bad = blob[:start] + Chunk(c.mode, c.orig_len, c.n_tokens, c.orig_crc32, bytes(p)).pack()
        with pytest.raises(IntdetError, match=r"x.idz: chunk 0 is corrupt \((impossible|decoded bytes)"):
            decomp(eng, bad)


def test_identical_bytes_any_batch_threads_isa(eng, tiny):
    data = TEXT.encode() + noise(100, 2)
    blobs = set()
    for isa in ISAS:
        for threads in (1, 2):
            with using_isa(isa, threads):
                e = Engine(load_model(tiny))
                blob, st = comp(e, data, ctx=48)
                blobs.add(blob)
                assert st.chunks > 5
                for batch in ((1, 3, 64) if threads == 1 else (4,)):
                    assert decomp(e, blob, batch) == data
    assert len(blobs) == 1


def test_tokenizer_that_does_not_rebuild(tiny, tmp_path):
    """A tokenizer with an NFKC normalizer changes "ﬁ" into "fi": that run
    goes to byte tokens and the bytes still come back."""
    import shutil

    d = tmp_path / "nfkc"
    shutil.copytree(tiny, d)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["normalizer"] = {"type": "NFKC"}
    (d / "tokenizer.json").write_text(json.dumps(tj))
    e = Engine(load_model(str(d)))
    data = "ﬁne ﬁsh. plain text here\n".encode() * 10
    blob, st = comp(e, data)
    assert st.byte_fallback_chunks >= 1
    assert decomp(e, blob) == data


def test_bytes_without_a_token_are_stored(eng, monkeypatch):
    """SmolLM2's vocabulary lacks 21 byte values: a chunk holding one is stored."""
    orig = TokenBytes.__init__

    def patched(self, *a, **kw):
        orig(self, *a, **kw)
        self.byte_ids[0xFF] = None

    monkeypatch.setattr(TokenBytes, "__init__", patched)
    monkeypatch.setattr(eng, "_compress_token_bytes", None, raising=False)  # rebuilt patched, restored after
    data = TEXT.encode() + b"\xff" + TEXT.encode()
    blob, st = comp(eng, data, ctx=64)
    assert st.stored_chunks >= 1 and st.stored_chunks < st.chunks
    assert decomp(eng, blob) == data


def test_chunks_bounded(eng):
    tb = TokenBytes(eng.lm.tokenizer, eng.lm.tok_meta, eng.vocab_size)
    data = (TEXT * 20).encode() + "✓✓✓".encode() * 200
    got = list(chunks(io.BytesIO(data).read, 40, tb, block=1000))
    assert b"".join(c for c, _, _ in got) == data
    assert all(1 <= len(ids) <= 40 and tb.bytes_of(ids) == c for c, ids, _ in got)
    # never inside a UTF-8 character
    assert all(c.decode("utf-8") for c, _, _ in got)


def test_corruption_truncation_wrong_model(eng, tiny_llama_hf, tmp_path):
    data = TEXT.encode()
    blob, _ = comp(eng, data, ctx=40)
    rng = np.random.default_rng(3)
    for pos in sorted(set(rng.integers(0, len(blob), 25).tolist())):
        bad = bytearray(blob)
        bad[pos] ^= 1 << int(rng.integers(8))
        with pytest.raises(IntdetError, match="x.idz: ") as e:
            decomp(eng, bytes(bad))
        assert "\n" not in str(e.value)
    for n in (0, 5, 30, len(blob) // 2, len(blob) - 1):
        with pytest.raises(IntdetError, match="x.idz: (truncated|not an intdet)"):
            decomp(eng, blob[:n])
    with pytest.raises(IntdetError, match="data after the last chunk"):
        decomp(eng, blob + b"\0")
    other = Engine(load_model(convert(models.write_hf_model(str(tmp_path / "o"), "llama", seed=7),
                                      str(tmp_path / "om"), progress=False)))
    with pytest.raises(IntdetError, match=r"model of sha256 [0-9a-f]{16}\.\.\., but .* has sha256 [0-9a-f]{16}"):
        decomp(other, blob)


def run_cli(*args, input=None, env=None):
    return subprocess.run([sys.executable, "-m", "intdet", *args], input=input, capture_output=True, env=env)


@pytest.mark.parametrize("prefix", [False, True], ids=["gemma-like", "space-prefix"])
def test_sentencepiece_round_trip(tmp_path, prefix):
    """A Gemma 3 GGUF with a SentencePiece (byte fallback) tokenizer: text
    with pieces, byte-fallback characters, control-token spellings and bytes
    that are not UTF-8 round-trips, through the tokenizer's ids (not the
    byte-token fallback) where the text is valid; with add_space_prefix the
    chunks are tokenized without the prefixed space, so they still rebuild."""
    path, _ = models.write_gemma3_gguf(str(tmp_path / "g.gguf"), "Q8_0", spm=True, add_space_prefix=prefix)
    out = convert(path, str(tmp_path / "m"), progress=False)
    e = Engine(load_model(out))
    tb = TokenBytes(e.lm.tokenizer, e.lm.tok_meta, e.vocab_size)
    assert tb.kind == "SentencePiece" and tb.table[e.lm.tok_meta["bos_token_id"]] == b"<bos>"
    assert tb.byte_ids[0x41] == models.SPM_TOY_PIECES.index(("<0x41>", models.SPM_BYTE, 0.0))
    text = "hello world abc <bos> <0x41> \u00fc \u65e5\u65e5\n\n\tx  xxx".encode() + b"\xff\xfe hello\r\n"
    ids, fb = tb.ids_of(text)
    assert not fb and tb.bytes_of(ids) == text and len(ids) < len(text)
    for data in (text * 5, b"", b"h", "\u00fc".encode() * 40):
        blob, st = comp(e, data, ctx=32)
        assert decomp(e, blob) == data
    assert st.chunks > 1 and st.byte_fallback_chunks == 0


def test_cli(tiny, tmp_path):
    env = dict(os.environ, INTDET_CACHE=str(tmp_path / "cache"))
    src = tmp_path / "a.txt"
    src.write_bytes(TEXT.encode() + b"\xc3")
    z, back = tmp_path / "a.idz", tmp_path / "b.txt"
    r = run_cli("compress", str(src), "-o", str(z), "-m", tiny, "--ctx", "64", "--json", env=env)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["in_bytes"] == src.stat().st_size and info["out_bytes"] == z.stat().st_size
    assert info["bits_per_byte"] == 8 * info["out_bytes"] / info["in_bytes"] and info["tokens"] > 0
    # the header names the model: decompress needs no -m
    r = run_cli("decompress", str(z), "-o", str(back), env=env)
    assert r.returncode == 0, r.stderr
    assert back.read_bytes() == src.read_bytes()
    # existing output, no --force: refused, untouched
    r = run_cli("decompress", str(z), "-o", str(back), env=env)
    assert r.returncode == 1 and b"exists (use --force" in r.stderr and back.read_bytes() == src.read_bytes()
    # stdin / stdout
    r = run_cli("compress", "-", "-o", "-", "-m", tiny, "--ctx", "64", input=src.read_bytes(), env=env)
    assert r.returncode == 0 and r.stdout == z.read_bytes()
    r = run_cli("decompress", "-", "-o", "-", input=r.stdout, env=env)
    assert r.returncode == 0 and r.stdout == src.read_bytes()
    # a corrupt file: one line, exit 1, nothing left behind
    bad = bytearray(z.read_bytes())
    bad[-3] ^= 0x40
    (tmp_path / "bad.idz").write_bytes(bytes(bad))
    before = set(os.listdir(tmp_path))
    r = run_cli("decompress", str(tmp_path / "bad.idz"), "-o", str(tmp_path / "c.txt"), env=env)
    assert r.returncode == 1 and r.stderr.count(b"\n") == 1 and b"corrupt" in r.stderr
    assert set(os.listdir(tmp_path)) == before
    r = run_cli("decompress", str(src), "-o", str(tmp_path / "d.txt"), env=env)
    assert r.returncode == 1 and b"not an intdet compressed file" in r.stderr
    r = run_cli("compress", str(tmp_path / "missing"), "-o", str(tmp_path / "e"), "-m", tiny, env=env)
    assert r.returncode == 1 and b"missing: cannot read" in r.stderr
    r = run_cli("compress", str(src), "-o", str(tmp_path / "f"), "-m", tiny, "--ctx", "100000", env=env)
    assert r.returncode == 1 and b"--ctx: 100000 must be in" in r.stderr and not (tmp_path / "f").exists()


def test_token_bytes_built_once_per_engine(eng):
    """compress and decompress share the engine's TokenBytes (built once)."""
    tb = codec._token_bytes(eng)
    assert codec._token_bytes(eng) is tb
    blob, _ = comp(eng, TEXT.encode())
    assert decomp(eng, blob) == TEXT.encode() and codec._token_bytes(eng) is tb


def test_cli_defaults_and_refusals(tiny, tmp_path):
    """The default --ctx fits a model with a shorter context; the output may
    not be the input; a missing -o is named."""
    env = dict(os.environ, INTDET_CACHE=str(tmp_path / "cache"))
    assert Engine(load_model(tiny)).context_length < 2048
    src = tmp_path / "a.txt"
    src.write_bytes(TEXT.encode())
    r = run_cli("compress", str(src), "-o", str(tmp_path / "a.idz"), "-m", tiny, "--json", env=env)
    assert r.returncode == 0, r.stderr
    r = run_cli("decompress", str(tmp_path / "a.idz"), "-o", "-", env=env)
    assert r.returncode == 0 and r.stdout == src.read_bytes()
    for cmd, other in (("compress", ["-m", tiny]), ("decompress", [])):
        target = src if cmd == "compress" else tmp_path / "a.idz"
        before = target.read_bytes()
        r = run_cli(cmd, str(target), "-o", str(target), "--force", *other, env=env)
        assert r.returncode == 1 and b"is the input file" in r.stderr and r.stderr.count(b"\n") == 1, r.stderr
        assert target.read_bytes() == before
    r = run_cli("compress", str(src), env=env)
    assert r.returncode == 1 and r.stderr.strip().endswith(b"(see 'intdet compress --help')"), r.stderr
    assert b"Missing option '-o'" in r.stderr


def test_cli_odd_output_paths(tiny, tmp_path):
    """-o "" and -o DIR/ are named before any work (they printed a temp
    file's path after the whole run)."""
    env = dict(os.environ, INTDET_CACHE=str(tmp_path / "cache"))
    src = tmp_path / "a.txt"
    src.write_bytes(TEXT.encode())
    for out, msg in (("", b"-o: empty path"), (str(tmp_path / "newdir") + "/", b"names a directory, not a file")):
        r = run_cli("compress", str(src), "-o", out, "-m", tiny, env=env)
        assert r.returncode == 1 and msg in r.stderr and r.stderr.count(b"\n") == 1, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]


def test_output_made_meanwhile_is_not_replaced(tmp_path):
    """Without --force the finished file goes into place only where no file
    is (another run may have made one since the start's check)."""
    from intdet.cli.compress import _place

    tmp, out = tmp_path / ".o.tmp", tmp_path / "o"
    tmp.write_bytes(b"new")
    out.write_bytes(b"other run's")
    with pytest.raises(IntdetError, match="exists \\(made while this ran; use --force"):
        _place(str(tmp), str(out), force=False)
    assert out.read_bytes() == b"other run's"
    out.unlink()
    _place(str(tmp), str(out), force=False)
    assert out.read_bytes() == b"new" and not tmp.exists()
    tmp.write_bytes(b"newer")
    _place(str(tmp), str(out), force=True)
    assert out.read_bytes() == b"newer" and not tmp.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_signal_during_compress_leaves_nothing(tiny, tmp_path, sig):
    """kill (SIGTERM) or a closed terminal (SIGHUP) while compressing: one
    line, exit 128 + signal, no temporary file left beside the output."""
    env = dict(os.environ, INTDET_CACHE=str(tmp_path / "cache"))
    src = tmp_path / "big.txt"
    src.write_bytes(TEXT.encode() * 400)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    run_cli("compress", str(src), "-o", str(out_dir / "warm.idz"), "-m", tiny, "--ctx", "16", env=env)  # converts
    (out_dir / "warm.idz").unlink()
    p = subprocess.Popen([sys.executable, "-m", "intdet", "compress", str(src), "-o", str(out_dir / "big.idz"),
                          "-m", tiny, "--ctx", "16", "--threads", "1"], stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not os.listdir(out_dir):  # the temp file exists: work has begun
        time.sleep(0.01)
    time.sleep(0.3)
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    if p.returncode == 0:  # finished before the signal (a very fast machine): nothing to check
        pytest.skip("compress finished before the signal")
    assert p.returncode == 128 + sig, err
    assert err.decode().strip() in ("intdet: terminated", "intdet: hung up"), err
    assert os.listdir(out_dir) == []


def test_relative_model_path_is_stored_absolute(tiny, tmp_path):
    """compress -m RELATIVE, then decompress (no -m) from another directory:
    the header names the model by its absolute path."""
    import shutil

    env = dict(os.environ, INTDET_CACHE=str(tmp_path / "cache"))
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    shutil.copytree(tiny, work / "m")
    (work / "a.txt").write_bytes(TEXT.encode())
    r = subprocess.run([sys.executable, "-m", "intdet", "compress", "a.txt", "-o", "a.idz", "-m", "m"], cwd=work,
                       capture_output=True, env=env)
    assert r.returncode == 0, r.stderr
    with open(work / "a.idz", "rb") as f:
        assert read_header(f, "a.idz").model_name == str(work / "m")
    r = subprocess.run([sys.executable, "-m", "intdet", "decompress", str(work / "a.idz"), "-o", "b.txt"],
                       cwd=elsewhere, capture_output=True, env=env)
    assert r.returncode == 0, r.stderr
    assert (elsewhere / "b.txt").read_bytes() == TEXT.encode()
    # a different model: the error names the one in the header
    other = convert(models.write_hf_model(str(tmp_path / "o"), "llama", seed=7), str(tmp_path / "om"), progress=False)
    r = subprocess.run([sys.executable, "-m", "intdet", "decompress", str(work / "a.idz"), "-o", "c.txt", "-m", other],
                       cwd=elsewhere, capture_output=True, env=env)
    assert r.returncode == 1 and f"compressed with the model '{work / 'm'}', of sha256".encode() in r.stderr, r.stderr
    assert not (elsewhere / "c.txt").exists()
