"""The real ``intdet`` CLI, run in a subprocess, on bad input and on good.

Every bad input must give: a non-zero exit (1), exactly one stderr line
``intdet: error: ...`` naming the file or argument, no traceback, and nothing
left behind (no output directory, no temporary ``.intdet-convert-*`` dir, no
cache entry). Each run gets its own INTDET_CACHE under tmp_path and
HF_HUB_OFFLINE=1, so nothing touches the network or the user's caches.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import models
import numpy as np
import pytest

CLI = [sys.executable, "-m", "intdet.cli"]
CTX = models.TINY["max_position_embeddings"]  # 256
VOCAB = models.TINY["vocab_size"]  # 320
HASH_RE = re.compile(r"\bhash ([0-9a-f]{12})\b")


class Run:
    def __init__(self, args, p: subprocess.CompletedProcess, cache):
        self.args, self.rc, self.cache = args, p.returncode, cache
        self.stdout = p.stdout.decode("utf-8", errors="replace")
        self.stderr = p.stderr.decode("utf-8", errors="replace")

    def __repr__(self):
        return (f"intdet {' '.join(map(str, self.args))!r}\n rc={self.rc}\n stdout={self.stdout[-2000:]!r}\n"
                f" stderr={self.stderr[-4000:]!r}")


def cli(args, cache, cwd=None, env=None, timeout=300) -> Run:
    """Run ``python -m intdet.cli *args`` with INTDET_CACHE=cache, offline."""
    e = dict(os.environ)
    e.update(INTDET_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_HUB_CACHE=os.path.join(str(cache), "_hub"),
             PYTHONIOENCODING="utf-8")
    e.update(env or {})
    args = [str(a) for a in args]
    p = subprocess.run(CLI + args, check=False, capture_output=True, cwd=cwd, env=e, timeout=timeout, stdin=subprocess.DEVNULL)
    return Run(args, p, cache)


def cache_models(cache) -> list:
    """Entries (hidden ones too) under the cache's models/ directory."""
    d = os.path.join(str(cache), "models")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def assert_error(r: Run, *needles, cache_entries=()):
    """One-line ``intdet: error:`` naming every needle, exit 1, no traceback,
    and the cache holds exactly ``cache_entries`` (nothing new, no temp dir)."""
    assert r.rc == 1, r
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r
    assert lines[0].startswith("intdet: error: "), r
    for n in needles:
        assert str(n) in lines[0], (n, r)
    assert r.stdout == "", r
    assert cache_models(r.cache) == sorted(cache_entries), r


def assert_no_output(out):
    out = str(out)
    assert not os.path.lexists(out), out
    parent = os.path.dirname(out)
    left = [n for n in os.listdir(parent) if n.startswith(".intdet-convert-")] if os.path.isdir(parent) else []
    assert left == [], left


def last_hash(r: Run) -> str:
    m = HASH_RE.search(r.stderr.splitlines()[-1])
    assert m, r
    return m.group(1)


# ------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def converted_llama(tiny_llama_hf, tmp_path_factory):
    """tiny_llama_hf converted with the CLI (a ready intdet model dir), so
    argument errors are checked without any conversion into the cache."""
    base = tmp_path_factory.mktemp("converted")
    out = base / "llama"
    r = cli(["convert", tiny_llama_hf, "-o", out], base / "cache")
    assert r.rc == 0, r
    return str(out)


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


def test_python_dash_m_runs_the_cli(cache):
    r = cli(["--help"], cache)
    assert r.rc == 0, r
    assert "generate" in r.stdout and "convert" in r.stdout


# ------------------------------------------------- 1. missing model file


def test_generate_missing_model_file(cache):
    r = cli(["generate", "-m", "/nonexistent/x.gguf", "--ids", "1,2"], cache)
    assert_error(r, "/nonexistent/x.gguf")


def test_convert_missing_model_file(cache, tmp_path):
    out = tmp_path / "out"
    r = cli(["convert", "/nonexistent/x.gguf", "-o", out], cache)
    assert_error(r, "/nonexistent/x.gguf")
    assert_no_output(out)


# ----------------------------------------------------- 2. truncated GGUF


@pytest.mark.parametrize("cut", ["3", "100", "half", "minus10"])
def test_truncated_gguf(tiny_llama_gguf, tmp_path, cache, cut):
    data = Path(tiny_llama_gguf).read_bytes()
    n = {"3": 3, "100": 100, "half": len(data) // 2, "minus10": len(data) - 10}[cut]
    bad = tmp_path / f"cut-{cut}.gguf"
    bad.write_bytes(data[:n])
    r = cli(["generate", "-m", bad, "--ids", "1,2", "-n", "2"], cache)
    assert_error(r, bad)
    out = tmp_path / "out"
    r = cli(["convert", bad, "-o", out], cache)
    assert_error(r, bad)
    assert_no_output(out)


def test_gguf_without_tokenizer(tmp_path, cache, monkeypatch):
    """A GGUF whose tokenizer.ggml.* keys are missing (the tokenizer reader
    raises ValueError): one line, not a traceback."""
    import gguf

    for meth in ("add_tokenizer_model", "add_tokenizer_pre", "add_token_list", "add_token_types",
                 "add_token_merges"):
        monkeypatch.setattr(gguf.GGUFWriter, meth, lambda self, *a, **k: None)
    bad = models.write_gguf_model(str(tmp_path / "notok.gguf"), "F32")
    monkeypatch.undo()
    out = tmp_path / "out"
    r = cli(["convert", bad, "-o", out], cache)
    assert_error(r, bad, "tokenizer")
    assert_no_output(out)


# ------------------------------------------------ 3. broken safetensors


def _copy_hf(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


@pytest.mark.parametrize("cut", ["half", "4"])
def test_truncated_safetensors(tiny_llama_hf, tmp_path, cache, cut):
    d = _copy_hf(tiny_llama_hf, tmp_path / "hf")
    st = os.path.join(d, "model.safetensors")
    data = Path(st).read_bytes()
    Path(st).write_bytes(data[: len(data) // 2 if cut == "half" else 4])
    r = cli(["generate", "-m", d, "--ids", "1,2", "-n", "2"], cache)
    assert_error(r, st)
    out = tmp_path / "out"
    r = cli(["convert", d, "-o", out], cache)
    assert_error(r, st)
    assert_no_output(out)


def test_safetensors_header_longer_than_file(tiny_llama_hf, tmp_path, cache):
    d = _copy_hf(tiny_llama_hf, tmp_path / "hf")
    st = os.path.join(d, "model.safetensors")
    data = bytearray(Path(st).read_bytes())
    data[:8] = (len(data) + 1000).to_bytes(8, "little")
    Path(st).write_bytes(bytes(data))
    r = cli(["generate", "-m", d, "--ids", "1,2", "-n", "2"], cache)
    assert_error(r, st, "header")
    out = tmp_path / "out"
    r = cli(["convert", d, "-o", out], cache)
    assert_error(r, st, "header")
    assert_no_output(out)


def test_truncated_converted_model(converted_llama, tmp_path, cache):
    """A converted intdet dir whose model.safetensors was cut short."""
    d = _copy_hf(converted_llama, tmp_path / "conv")
    st = os.path.join(d, "model.safetensors")
    data = Path(st).read_bytes()
    Path(st).write_bytes(data[: len(data) * 2 // 3])
    assert_error(cli(["generate", "-m", d, "--ids", "1,2", "-n", "2"], cache), st)


def test_corrupt_tokenizer_in_converted_model(converted_llama, tmp_path, cache):
    d = _copy_hf(converted_llama, tmp_path / "conv")
    Path(d, "tokenizer.json").write_text("{not json")
    assert_error(cli(["generate", "-m", d, "--ids", "1,2", "-n", "2"], cache), "tokenizer.json")


# --------------------------------------- 4. unsupported architecture/config


UNSUPPORTED = {
    "gpt2": ("llama", {"architectures": ["GPT2LMHeadModel"]}, "GPT2LMHeadModel"),
    "dynamic_rope": ("qwen2", {"rope_scaling": {"rope_type": "dynamic", "factor": 4}}, "dynamic"),  # yarn is supported now
    "sliding_window": ("qwen2", {"use_sliding_window": True, "sliding_window": 16}, "sliding"),
    "gelu": ("llama", {"hidden_act": "gelu"}, "gelu"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_unsupported_config(tmp_path, cache, case):
    arch, overrides, word = UNSUPPORTED[case]
    d = models.write_hf_model(str(tmp_path / "hf"), arch, **overrides)
    cfg = os.path.join(d, "config.json")
    r = cli(["generate", "-m", d, "--ids", "1,2", "-n", "2"], cache)
    assert_error(r, cfg, word)
    out = tmp_path / "out"
    r = cli(["convert", d, "-o", out], cache)
    assert_error(r, cfg, word)
    assert_no_output(out)


MALFORMED = {  # config.json key -> value (None: the key removed), words of the one-line error
    "missing_key": ("hidden_size", None, ["missing key 'hidden_size'"]),
    "bad_value": ("num_attention_heads", "many", ['num_attention_heads = "many" must be a positive integer']),
    # read with int() these converted as 72 (72.5, "72") or failed on a tensor's shape (true)
    "float_size": ("hidden_size", 72.5, ["hidden_size = 72.5 must be a positive integer"]),
    "string_size": ("hidden_size", "72", ['hidden_size = "72" must be a positive integer']),
    "bool_size": ("hidden_size", True, ["hidden_size = true must be a positive integer"]),
    "null_size": ("hidden_size", "null", ["hidden_size = null must be a positive integer"]),
    "string_theta": ("rope_theta", "abc", ['rope_theta = "abc" must be a finite number']),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_config(tiny_llama_hf, tmp_path, cache, case):
    key, value, words = MALFORMED[case]
    d = _copy_hf(tiny_llama_hf, tmp_path / "hf")
    cfg_path = os.path.join(d, "config.json")
    cfg = json.loads(Path(cfg_path).read_text())
    if value is None:
        del cfg[key]
    else:
        cfg[key] = None if value == "null" else value
    Path(cfg_path).write_text(json.dumps(cfg))
    r = cli(["generate", "-m", d, "--ids", "1,2", "-n", "2"], cache)
    assert_error(r, cfg_path, *words)


# ------------------------------------------------------------ 5. NaN


def test_nan_weight(tmp_path, cache):
    from safetensors.numpy import load_file, save_file

    d = models.write_hf_model(str(tmp_path / "hf"), "llama")
    st = os.path.join(d, "model.safetensors")
    t = load_file(st)
    name = "model.layers.1.mlp.up_proj.weight"
    t[name][3, 5] = np.nan
    save_file(t, st)
    r = cli(["generate", "-m", d, "--ids", "1,2", "-n", "2"], cache)
    # weights are read as they are quantized (streamed), so the NaN is met after
    # the "converting ... into the cache" notice: that line, then the one error
    notice, _, rest = r.stderr.partition("\n")
    assert notice.startswith("intdet: converting "), r
    assert_error(Run(r.args, subprocess.CompletedProcess(r.args, r.rc, r.stdout.encode(), rest.encode()), cache),
                 st, name, "NaN")
    out = tmp_path / "out"
    r = cli(["convert", d, "-o", out], cache)
    assert_error(r, st, name, "NaN")
    assert_no_output(out)


# ------------------------------------------------ 6. context length


def test_text_prompt_longer_than_context(converted_llama, cache):
    r = cli(["generate", "-m", converted_llama, "-n", "2", " ".join(["hello world"] * 100)], cache)
    assert_error(r, "prompt", str(CTX))


def test_ids_prompt_longer_than_context(converted_llama, cache):
    r = cli(["generate", "-m", converted_llama, "-n", "2", "--ids", ",".join(["5"] * 300)], cache)
    assert_error(r, "prompt", "300", str(CTX))


def test_prompt_file_longer_than_context(converted_llama, tmp_path, cache):
    f = tmp_path / "long.txt"
    f.write_text("The quick brown fox jumps over the lazy dog. " * 25)  # ~1100 chars
    assert_error(cli(["generate", "-m", converted_llama, "-f", f], cache), "prompt", str(CTX))


def test_n_beyond_context_stops_at_context_end(converted_llama, cache):
    """-n larger than the room left is not an error: generation stops at the
    end of the context."""
    n_prompt = CTX - 6
    r = cli(["generate", "-m", converted_llama, "-n", "100", "--json", "--ids", ",".join(["5"] * n_prompt)], cache)
    assert r.rc == 0, r
    assert "Traceback" not in r.stderr, r
    st = json.loads(r.stdout)
    assert st["prompt_tokens"] == n_prompt
    assert 1 <= st["generated_tokens"] <= CTX - n_prompt + 1, st
    if st["stop"] == "length":
        assert st["generated_tokens"] == CTX - n_prompt + 1, st
    # streaming mode too
    r = cli(["generate", "-m", converted_llama, "-n", "100", "--ids", ",".join(["5"] * n_prompt)], cache)
    assert r.rc == 0, r
    assert HASH_RE.search(r.stderr.splitlines()[-1]).group(1) == st["hash"], r
    # and the largest prompt that fits
    r = cli(["generate", "-m", converted_llama, "-n", "50", "--ids", ",".join(["5"] * (CTX - 1))], cache)
    assert r.rc == 0, r
    assert cache_models(cache) == []


# -------------------------------------------------- 7. bad arguments


BAD_ARGS = {
    "empty_prompt": (["", "-n", "2"], ["prompt"]),
    "ids_not_integer": (["--ids", "1,two,3"], ["--ids", "two"]),
    "ids_too_large": (["--ids", f"1,{VOCAB}"], ["--ids", str(VOCAB)]),
    "ids_negative": (["--ids", "1,-4"], ["--ids", "-4"]),
    "device_unknown": (["--ids", "1", "--device", "foo"], ["--device", "foo"]),
    "n_negative": (["--ids", "1", "-n", "-3"], ["-n", "-3"]),
    "temperature_not_number": (["--ids", "1", "--temperature", "abc"], ["--temperature", "abc"]),
    "top_p_above_one": (["--ids", "1", "--top-p", "1.5"], ["--top-p", "1.5"]),
    "top_k_negative": (["--ids", "1", "--top-k", "-2"], ["--top-k", "-2"]),
    "stop_empty": (["--ids", "1", "--stop", "x", "--stop", ""], ["--stop", "an empty string never ends the text"]),
    "no_prompt": ([], ["prompt"]),
    "prompt_twice": (["hi", "-p", "there"], ["prompt"]),
    "prompt_file_missing": (["-f", "/nonexistent/prompt.txt"], ["/nonexistent/prompt.txt"]),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGS))
def test_bad_generate_arguments(converted_llama, cache, case):
    args, needles = BAD_ARGS[case]
    assert_error(cli(["generate", "-m", converted_llama, *args], cache), *needles)


def test_field_errors_name_the_option(converted_llama, cache):
    """The library names fields ("top_p: ..."); the CLI prints the option
    that gives each (one table, cli/errors.OPTIONS), the whole line as before."""
    r = cli(["generate", "-m", converted_llama, "--ids", "1", "--temperature", "1", "--top-p", "2"], cache)
    assert r.rc == 1 and r.stderr == "intdet: error: --top-p: 2 is outside (0, 1]\n", r
    r = cli(["generate", "-m", converted_llama + "-missing", "--ids", "1"], cache)
    assert r.rc == 1 and r.stderr == f"intdet: error: -m: {converted_llama}-missing: no such file or directory\n", r


def test_option_message_table():
    from intdet.cli.errors import OPTIONS, option_message
    from intdet.errors import IntdetError

    assert option_message(IntdetError("top_p: 2 is outside (0, 1]", field="top_p")) == "--top-p: 2 is outside (0, 1]"
    assert option_message(IntdetError("device 'tpu' is not available", field="device")) == \
        "--device 'tpu' is not available"
    assert option_message(IntdetError("model: x: no such file or directory", field="model")) == \
        "-m: x: no such file or directory"
    for msg, field in (("top_p: 2", None), ("the top_p is 2", "top_p"), ("top_pp: 2", "top_p"),
                       ("messages: bad", "messages")):  # no field, not at the start, another word, no option
        assert option_message(IntdetError(msg, field=field)) == msg
    assert all(opt.startswith("-") and " " not in opt for opt in OPTIONS.values())


def test_bad_arguments_checked_before_conversion(tiny_llama_hf, cache):
    """Option errors come before the source is converted into the cache."""
    for args, needle in ((["--ids", "1", "--device", "foo"], "--device"), (["--ids", "1", "-n", "-1"], "-n"),
                         (["--ids", "1", "--top-p", "0"], "--top-p"), (["--ids", "x"], "--ids")):
        assert_error(cli(["generate", "-m", tiny_llama_hf, *args], cache), needle)


def test_invalid_utf8_prompt_file(converted_llama, tmp_path, cache):
    f = tmp_path / "bad.txt"
    f.write_bytes(b"hello \xff\xfe world")
    assert_error(cli(["generate", "-m", converted_llama, "-f", f], cache), f, "UTF-8")


def test_invalid_utf8_prompt_argument(converted_llama, cache):
    """argv bytes that are not UTF-8 (Python holds them as surrogate escapes;
    subprocess writes them back as the bytes): one line naming the argument."""
    for args, needle in ((["abc\udcff"], "PROMPT: not valid UTF-8 (byte 3)"),
                         (["-p", "\udcc3"], "-p: not valid UTF-8 (byte 0)"),
                         (["--chat", "--system", "s\udcfe", "hi"], "--system: not valid UTF-8 (byte 1)")):
        assert_error(cli(["generate", "-m", converted_llama, "-n", "1", *args], cache), needle)


def _with_chat_template(src, dst, template):
    d = _copy_hf(src, dst)
    p = os.path.join(d, "tokenizer_config.json")
    c = json.loads(Path(p).read_text())
    if template is None:
        c.pop("chat_template", None)
    else:
        c["chat_template"] = template
    Path(p).write_text(json.dumps(c))
    return d


def test_chat_without_template(converted_llama, tmp_path, cache):
    # The tiny models ship a chat template; this copy has it removed.
    d = _with_chat_template(converted_llama, tmp_path / "nochat", None)
    assert_error(cli(["generate", "-m", d, "--chat", "hi", "-n", "2"], cache), "chat")


@pytest.mark.parametrize("template", ["{{ raise_exception('no system role') }}", "{% for %}"])
def test_chat_template_failure(converted_llama, tmp_path, cache, template):
    d = _with_chat_template(converted_llama, tmp_path / "badchat", template)
    assert_error(cli(["generate", "-m", d, "--chat", "hi", "-n", "2"], cache), "chat template")


def test_chat_with_template_works(converted_llama, cache):
    r = cli(["generate", "-m", converted_llama, "--chat", "hi", "-n", "3"], cache)
    assert r.rc == 0, r
    last_hash(r)


# -------------------------------------------- 8. convert into existing dir


def test_convert_into_non_empty_dir(tiny_llama_hf, tmp_path, cache):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = cli(["convert", tiny_llama_hf, "-o", out], cache)
    assert_error(r, out, "--force")
    assert sorted(os.listdir(out)) == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "mine"
    assert [n for n in os.listdir(tmp_path) if n.startswith(".intdet-convert-")] == []


def test_convert_over_a_file(tiny_llama_hf, tmp_path, cache):
    out = tmp_path / "out"
    out.write_text("a file")
    assert_error(cli(["convert", tiny_llama_hf, "-o", out], cache), out)
    assert out.read_text() == "a file"
    assert_error(cli(["convert", tiny_llama_hf, "-o", out, "--force"], cache), "not a directory")
    assert out.read_text() == "a file"  # --force replaces only an intdet model directory


def test_convert_force_replaces_only_a_model_dir(tiny_llama_hf, tmp_path, cache):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    assert_error(cli(["convert", tiny_llama_hf, "-o", out, "--force"], cache), "not an intdet model directory")
    assert sorted(os.listdir(out)) == ["old.txt"]
    os.unlink(out / "old.txt")
    assert cli(["convert", tiny_llama_hf, "-o", out], cache).rc == 0
    r = cli(["convert", tiny_llama_hf, "-o", out, "--force"], cache)
    assert r.rc == 0, r
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert [n for n in os.listdir(tmp_path) if n.startswith(".intdet-convert-")] == []


def test_convert_under_a_file(tiny_llama_hf, tmp_path, cache):
    """OUT's parent is a regular file: an OSError, reported on one line."""
    parent = tmp_path / "afile"
    parent.write_text("x")
    assert_error(cli(["convert", tiny_llama_hf, "-o", parent / "out"], cache), str(parent))
    assert parent.read_text() == "x"


def test_convert_into_unwritable_dir(tiny_llama_hf, tmp_path, cache):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions")
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        r = cli(["convert", tiny_llama_hf, "-o", parent / "out"], cache)
        assert_error(r, str(parent))
    finally:
        parent.chmod(0o700)


# ------------------------------------------------------------ positive


def test_generate_ids_prints_hash(tiny_llama_hf, cache):
    args = ["generate", "-m", tiny_llama_hf, "--ids", "1,5,9", "-n", "8"]
    r1 = cli(args, cache)
    assert r1.rc == 0, r1
    assert "Traceback" not in r1.stderr
    h1 = last_hash(r1)
    assert len(cache_models(cache)) == 1, cache_models(cache)
    # second run: same hash, served from the cache (still exactly one entry)
    r2 = cli(args, cache)
    assert r2.rc == 0, r2
    assert last_hash(r2) == h1
    assert r2.stdout == r1.stdout
    # --json: the same generation as one JSON object
    r3 = cli(args + ["--json"], cache)
    assert r3.rc == 0, r3
    st = json.loads(r3.stdout)
    assert {"hash", "hashes", "tokens", "text"} <= set(st), st
    assert st["hash"] == h1
    assert "1" in st["hashes"]
    assert len(st["tokens"]) == st["generated_tokens"] <= 8
    assert all(isinstance(t, int) and 0 <= t < VOCAB for t in st["tokens"])
    entries = cache_models(cache)
    assert len(entries) == 1 and not entries[0].startswith("."), entries


def test_device_ref_matches_cpu(converted_llama, cache):
    base = ["generate", "-m", converted_llama, "--ids", "1,5,9", "-n", "4"]
    cpu, ref = cli(base + ["--device", "cpu"], cache), cli(base + ["--device", "ref"], cache)
    assert cpu.rc == 0, cpu
    assert ref.rc == 0, ref
    assert last_hash(cpu) == last_hash(ref)
    assert cpu.stdout == ref.stdout


def test_padding_token_ids_are_streamed_without_error(converted_llama, cache):
    """The embedding has more rows (320) than the tokenizer has tokens (302),
    as in real checkpoints; a sampled padding id must not crash streaming."""
    base = ["generate", "-m", converted_llama, "--ids", "1,2,3", "-n", "60", "--temperature", "100"]
    for seed in range(1, 11):
        r = cli(base + ["--seed", seed, "--json"], cache)
        assert r.rc == 0, r
        st = json.loads(r.stdout)
        if any(t >= models.TOKENIZER_SIZE for t in st["tokens"]):
            break
    else:
        pytest.skip("no padding id sampled")
    r = cli(base + ["--seed", seed], cache)
    assert r.rc == 0, r
    assert last_hash(r) == st["hash"]
    assert r.stdout == st["text"] + "\n"


@pytest.mark.parametrize("fixture", ["tiny_llama_hf", "tiny_qwen2_hf", "tiny_qwen3_hf", "tiny_llama_gguf"])
def test_convert_each_fixture(request, tmp_path, cache, fixture):
    src = request.getfixturevalue(fixture)
    out = tmp_path / "sub" / "out"
    r = cli(["convert", src, "-o", out], cache)
    assert r.rc == 0, r
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert os.path.isfile(out / name), name
    assert json.loads((out / "config.json").read_text())["format"] == "intdet"
    assert [n for n in os.listdir(out.parent) if n.startswith(".intdet-convert-")] == []
    assert cache_models(cache) == []  # convert -o writes only OUT
    r = cli(["generate", "-m", out, "--ids", "1,2", "-n", "3"], cache)
    assert r.rc == 0, r
    last_hash(r)
    assert cache_models(cache) == []  # a converted dir is used in place


@pytest.mark.parametrize("cmd", [["convert", "SRC", "-o", "/proc/intdet-no/out"],
                                 ["random-model", "/proc/intdet-no/out", "--shape", "tiny-llama"]])
def test_unwritable_output_is_named_not_its_temporary(cmd, tiny_llama_gguf, cache):
    """A write error names the OUT the user gave, not the hidden temporary
    directory beside it."""
    args = [tiny_llama_gguf if a == "SRC" else a for a in cmd]
    r = subprocess.run([sys.executable, "-m", "intdet", *args], capture_output=True, text=True,
                       env=dict(os.environ, INTDET_CACHE=str(cache)))
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("intdet: error: /proc/intdet-no/out: cannot write"), r.stderr
    assert ".partial-" not in r.stderr and ".intdet-convert-" not in r.stderr


def test_random_model_empty_out_is_named(tmp_path, cache):
    """'' named the current directory ("exists and is not an empty directory")."""
    r = subprocess.run([sys.executable, "-m", "intdet", "random-model", "", "--shape", "tiny-llama"],
                       capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, INTDET_CACHE=str(cache)))
    assert r.returncode == 1 and r.stderr == "intdet: error: OUT: empty path\n", r.stderr
    assert os.listdir(tmp_path) == []
