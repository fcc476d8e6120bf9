"""intdet perplexity puts BOS first in every window when the tokenizer adds
one (add_bos_token, as Gemma 3's GGUF says): the windows, and the CLI
against a direct computation on a model whose config asks for BOS."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from intdet.convert import convert
from intdet.errors import IntdetError
from intdet.model import Engine, load_model
from intdet.perplexity import window_bos, windows_of
from intdet.tokenizer import encode

TEXT = ("The quick brown fox jumps over the lazy dog. " * 40 + "Integer arithmetic is exact. " * 30)


def test_windows_with_bos():
    ids = list(range(100, 120))
    assert windows_of(ids, 5) == [ids[0:5], ids[5:10], ids[10:15], ids[15:20]]
    w = windows_of(ids, 5, bos=2)
    # BOS + 4 consecutive text tokens each; every text token in order, none twice.
    assert w == [[2] + ids[0:4], [2] + ids[4:8], [2] + ids[8:12], [2] + ids[12:16], [2] + ids[16:20]]
    assert windows_of(ids, 5, 2, bos=2) == w[:2]
    assert windows_of(ids[:4], 5, bos=2) == [[2] + ids[:4]]
    with pytest.raises(IntdetError, match="fewer than one window"):
        windows_of(ids[:3], 5, bos=2)
    assert window_bos({"add_bos_token": True, "bos_token_id": 2}) == 2
    assert window_bos({"add_bos_token": False, "bos_token_id": 2}) is None
    assert window_bos({"add_bos_token": True, "bos_token_id": None}) is None
    assert window_bos({}) is None


def test_cli_puts_bos_first(tiny_llama_hf, tmp_path):
    out = convert(tiny_llama_hf, str(tmp_path / "m"), progress=False)
    cfg_path = os.path.join(out, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["add_bos_token"] = True
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    lm = load_model(out)
    bos = lm.tok_meta["bos_token_id"]
    assert lm.tok_meta["add_bos_token"] and bos is not None
    f = tmp_path / "t.txt"
    f.write_text(TEXT, encoding="utf-8")
    env = dict(os.environ, INTDET_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "intdet.cli", "perplexity", "-m", out, "-f", str(f), "--ctx", "64",
                        "--max-windows", "3", "--json"], capture_output=True, text=True, env=env, check=True)
    got = json.loads(r.stdout)
    ids = encode(lm.tokenizer, lm.tok_meta, TEXT, add_bos=False)
    nll = {True: 0.0, False: 0.0}
    for with_bos in (True, False):
        for w in range(3):
            win = [bos] + ids[w * 63:(w + 1) * 63] if with_bos else ids[w * 64:(w + 1) * 64]
            lg = Engine(lm).new_state(64).forward(win, all_logits=True).astype(np.float64) / 65536.0
            for j in range(63):
                row = lg[j] - lg[j].max()
                nll[with_bos] -= row[win[j + 1]] - math.log(np.exp(row).sum())
    assert got["tokens"] == 189 and got["windows"] == 3
    assert got["perplexity"] == pytest.approx(math.exp(nll[True] / 189), rel=1e-9)
    assert abs(nll[True] - nll[False]) > 1e-6  # the BOS windows are not the plain ones


def test_batch_perplexity_puts_bos_first(tiny_llama_hf, tmp_path):
    """intdet batch's perplexity task: a text item gets the same BOS windows
    as intdet perplexity (its exact NLL equals the windows scored directly);
    an ids item runs as given."""
    from intdet.batch.items import Item
    from intdet.batch.tasks import TaskRunner

    out = convert(tiny_llama_hf, str(tmp_path / "m"), progress=False)
    cfg_path = os.path.join(out, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["add_bos_token"] = True
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    runner = TaskRunner(out, threads=1)
    llm = runner.llm
    bos = llm.meta["bos_token_id"]
    ids = llm.encode(TEXT, add_bos=False)
    wins = runner._perplexity_windows(Item(0, "t", "t", "perplexity", {"text": TEXT, "ctx": 64}))
    assert wins == windows_of(ids, 64, bos=bos) and all(w[0] == bos for w in wins)
    short = "a few words"
    assert runner._perplexity_windows(Item(1, "s", "s", "perplexity", {"text": short})) == [
        [bos] + llm.encode(short, add_bos=False)]
    given = list(range(5, 45))
    assert runner._perplexity_windows(Item(2, "i", "i", "perplexity", {"ids": given, "ctx": 16})) == windows_of(given, 16)
