"""`intdet bench` and intdet.bench.run_bench on a tiny model: output structure only
(timings are never asserted; the machine may be loaded)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from intdet.bench import ROW_KEYS, bench_prompt_ids, format_table, run_bench
from intdet.convert import convert
from intdet.errors import IntdetError
from intdet.model import load_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_llama_hf):
    return convert(tiny_llama_hf, str(tmp_path_factory.mktemp("bench") / "m"), progress=False)


def test_prompt_ids_exact_length_and_deterministic(tiny_dir):
    lm = load_model(tiny_dir)
    for n in (1, 7, 100):
        ids = bench_prompt_ids(lm, n)
        assert len(ids) == n and all(0 <= t < lm.cfg["vocab_size"] for t in ids)
        assert ids == bench_prompt_ids(lm, n)
    assert bench_prompt_ids(lm, 100)[:7] == bench_prompt_ids(lm, 7)


def test_run_bench_rows(tiny_dir):
    lm = load_model(tiny_dir)
    rows = run_bench(lm, prompt_tokens=12, gen_tokens=3, threads=[1, 2], batch=2)
    assert len(rows) == 2
    for r, t in zip(rows, (1, 2)):
        assert set(r) == set(ROW_KEYS)
        assert r["threads_requested"] == t and r["threads"] == t
        assert r["prompt_tokens"] == 12 and r["gen_tokens"] == 3 and r["batch"] == 2
        assert isinstance(r["isa"], str) and r["isa"]
        for k in ("prefill_tok_s", "decode_tok_s", "batch_decode_tok_s"):
            assert r[k] is None or r[k] > 0
        assert r["peak_rss_bytes"] > 0
    # greedy tokens do not depend on the thread count
    assert rows[0]["decode_tokens_hash"] == rows[1]["decode_tokens_hash"]
    table = format_table(rows).splitlines()
    assert len(table) == 2 + len(rows) and "pp12 tok/s" in table[1] and "tg3 x2 tok/s" in table[1]


def test_run_bench_batch1_has_no_batch_figures(tiny_dir):
    (r,) = run_bench(load_model(tiny_dir), prompt_tokens=5, gen_tokens=2)
    assert r["batch"] == 1 and r["batch_decode_tok_s"] is None and r["batch_decode_s"] is None
    assert r["threads_requested"] == 0 and r["threads"] >= 1


def test_run_bench_rejects_sizes_past_context(tiny_dir):
    lm = load_model(tiny_dir)
    ctx = lm.cfg["context_length"]
    with pytest.raises(IntdetError, match="context length"):
        run_bench(lm, prompt_tokens=ctx, gen_tokens=1)
    with pytest.raises(IntdetError, match="^gen_tokens: 0 must be >= 1$"):  # the field; the CLI says --gen-tokens
        run_bench(lm, prompt_tokens=4, gen_tokens=0)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "intdet.cli", "bench", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_bench_json_and_table(tiny_dir):
    r = cli("-m", tiny_dir, "--prompt-tokens", "10", "--gen-tokens", "2", "--threads", "1", "--threads", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["model"] == tiny_dir and [row["threads"] for row in out["rows"]] == [1, 2]
    assert all(set(row) == set(ROW_KEYS) for row in out["rows"])

    r = cli("-m", tiny_dir, "--prompt-tokens", "10", "--gen-tokens", "2", "--threads", "1", "--batch", "3")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3 and "x3 tok/s" in lines[1]


def test_cli_bench_error_is_one_line(tiny_dir):
    r = cli("-m", tiny_dir, "--prompt-tokens", "10000")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("intdet: error:") and len(r.stderr.strip().splitlines()) == 1
