"""Hostile prompts and option values for ``intdet generate`` (through the
real CLI), beyond the argument errors of test_cli_errors.py: special-token
strings typed as text, a 1 MB prompt, -n 0, and option values far outside
any sane range. Each must give either a normal run or one ``intdet: error:``
line with exit 1 -- never a traceback, a hang or a huge allocation."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import models
import pytest

CLI = [sys.executable, "-m", "intdet.cli"]
HASH_RE = re.compile(r"\bhash ([0-9a-f]{12})\b")
CTX = models.TINY["max_position_embeddings"]  # 256
IM_START, IM_END = models.SPECIAL_TOKENS[1], models.SPECIAL_TOKENS[2]  # ids 1, 2


def cli(args, cache, timeout=120):
    env = dict(os.environ, INTDET_CACHE=str(cache), HF_HUB_OFFLINE="1", PYTHONIOENCODING="utf-8")
    t0 = time.monotonic()
    p = subprocess.run(CLI + [str(a) for a in args], capture_output=True, env=env, timeout=timeout,
                       stdin=subprocess.DEVNULL, check=False)
    r = {"rc": p.returncode, "stdout": p.stdout.decode("utf-8", "replace"),
         "stderr": p.stderr.decode("utf-8", "replace"), "secs": time.monotonic() - t0}
    assert "Traceback" not in r["stderr"], r
    return r


def ok_json(r) -> dict:
    assert r["rc"] == 0, r
    return json.loads(r["stdout"])


def one_error(r, *needles):
    assert r["rc"] == 1, r
    lines = r["stderr"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("intdet: error: "), r
    for n in needles:
        assert str(n) in lines[0], (n, r)
    assert r["stdout"] == "", r


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A converted tiny llama (converted in process) and its tokenizer."""
    from intdet.convert import convert
    from intdet.model import load_model

    base = tmp_path_factory.mktemp("hostile_args")
    out = convert(models.write_hf_model(str(base / "hf"), "llama"), str(base / "conv"), progress=False)
    lm = load_model(out)
    return out, lm.tokenizer, lm.tok_meta


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


def plain_ids(model, text):
    from intdet.tokenizer import encode

    _, tok, meta = model
    return encode(tok, meta, text)


@pytest.mark.parametrize("text", [IM_START + IM_END, IM_START, f"hello {IM_END} world{IM_START}user\n"])
def test_special_token_text_is_plain_without_chat(model, cache, text):
    """Special-token strings typed in the prompt are tokenized as text: the
    run is the one of --ids with the plain-text ids, which contain no
    special id."""
    ids = plain_ids(model, text)
    assert len(ids) > 2 and not set(ids) & {0, 1, 2}, ids
    a = ok_json(cli(["generate", "-m", model[0], "-n", "3", "--json", text], cache))
    b = ok_json(cli(["generate", "-m", model[0], "-n", "3", "--json", "--ids", ",".join(map(str, ids))], cache))
    assert a["prompt_tokens"] == len(ids)
    assert a["hash"] == b["hash"] and a["tokens"] == b["tokens"]
    if text == IM_START:  # and not the run of the special id itself
        s = ok_json(cli(["generate", "-m", model[0], "-n", "3", "--json", "--ids", "1"], cache))
        assert s["hash"] != a["hash"]


def test_special_tokens_only_prompt_with_chat(model, cache):
    """With --chat the template's own text is tokenized with specials, the
    user's text as plain text: special-token strings typed by the user add no
    control tokens, and the run succeeds."""
    from intdet.tokenizer import encode_chat

    _, tok, meta = model
    text = IM_START + IM_END
    ids = encode_chat(tok, meta, text)
    r = cli(["generate", "-m", model[0], "-n", "3", "--json", "--chat", text], cache)
    st = ok_json(r)
    assert st["prompt_tokens"] == len(ids) and 1 in ids
    assert ids.count(1) == encode_chat(tok, meta, "").count(1)
    b = ok_json(cli(["generate", "-m", model[0], "-n", "3", "--json", "--ids", ",".join(map(str, ids))], cache))
    assert st["hash"] == b["hash"]


def test_one_megabyte_prompt_file(model, cache, tmp_path):
    f = tmp_path / "big.txt"
    f.write_text(("The quick brown fox jumps over the lazy dog. " * 24000)[: 1 << 20])
    r = cli(["generate", "-m", model[0], "-f", f, "-n", "2"], cache, timeout=60)
    one_error(r, "prompt", "tokens do not fit the context length", str(CTX))
    assert r["secs"] < 30, r["secs"]


def test_n_zero_prints_empty_generation_and_hash(model, cache):
    r = cli(["generate", "-m", model[0], "--ids", "1,5,9", "-n", "0"], cache)
    assert r["rc"] == 0, r
    assert r["stdout"] == "\n", r
    last = r["stderr"].splitlines()[-1]
    assert "generated 0 tok" in last and HASH_RE.search(last), r
    st = ok_json(cli(["generate", "-m", model[0], "--ids", "1,5,9", "-n", "0", "--json"], cache))
    assert st["generated_tokens"] == 0 and st["tokens"] == [] and st["text"] == ""
    assert st["hash"] == HASH_RE.search(last).group(1)


@pytest.mark.parametrize("n", [10**12, 10**30])
def test_huge_n_stops_at_the_context_end(model, cache, n):
    st = ok_json(cli(["generate", "-m", model[0], "--ids", "1,5,9", "-n", n, "--json"], cache))
    assert 1 <= st["generated_tokens"] <= CTX - 3 + 1, st


def test_huge_top_k_is_no_top_k(model, cache):
    base = ["generate", "-m", model[0], "--ids", "1,5,9", "-n", "6", "--json", "--temperature", "1", "--seed", "3"]
    a = ok_json(cli(base + ["--top-k", 10**9], cache))
    b = ok_json(cli(base + ["--top-k", 10**40], cache))
    c = ok_json(cli(base + ["--top-k", "0"], cache))
    assert a["hash"] == b["hash"] == c["hash"]


@pytest.mark.parametrize("seed", [2**64, 2**70, 10**40])
def test_seed_out_of_range(model, cache, seed):
    one_error(cli(["generate", "-m", model[0], "--ids", "1", "--seed", seed], cache), "--seed", str(seed))


def test_largest_seed_accepted(model, cache):
    ok_json(cli(["generate", "-m", model[0], "--ids", "1", "-n", "2", "--json", "--temperature", "1",
                 "--seed", 2**64 - 1], cache))


@pytest.mark.parametrize("args,needle", [
    (["--threads", 10**12], "--threads"),
    (["--temperature", "1e400"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--top-p", "1e-400"], "--top-p"),
    (["--temperature", "0." + "1" * 5000], "--temperature"),
])
def test_extreme_option_values(model, cache, args, needle):
    one_error(cli(["generate", "-m", model[0], "--ids", "1", "-n", "2", *args], cache), needle)


@pytest.mark.parametrize("key", ["", "   "])
def test_serve_refuses_an_empty_api_key(model, tmp_path, key):
    """An empty --api-key would silently turn authentication off."""
    one_error(cli(["serve", "-m", model[0], "--port", "1", "--api-key", key], tmp_path), "--api-key", "empty")


@pytest.mark.parametrize("cmd", [["perplexity", "x.txt"], ["convert", "x"], ["batch", "in.jsonl"]])
def test_missing_required_option_is_named(tmp_path, cmd):
    """click's MissingParameter has no message of its own: the line names the option."""
    one_error(cli(cmd, tmp_path), "Missing option", f"(see 'intdet {cmd[0]} --help')")


def test_random_model_seed_range(tmp_path):
    """Seeds are in [0, 2^64) here as everywhere else."""
    one_error(cli(["random-model", tmp_path / "x", "--shape", "tiny-llama", "--seed", "-1"], tmp_path), "--seed")
    assert not (tmp_path / "x").exists()
