"""convert records model.safetensors' sha256 in config.json; loading compares
it with the sha256 it computes anyway and refuses a damaged or changed file
(one line naming it), unless INTDET_SKIP_SHA256_CHECK=1. Models converted
before the record existed load as before."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from intdet import LLM, SamplingParams
from intdet.background import sha256_file
from intdet.convert import convert
from intdet.errors import IntdetError
from intdet.model import Engine, load_model
from intdet.safetensors_io import SafetensorsFile


@pytest.fixture(scope="module")
def converted(tiny_llama_hf, tmp_path_factory):
    return convert(tiny_llama_hf, str(tmp_path_factory.mktemp("sha") / "m"), progress=False)


def cfg_of(d):
    with open(os.path.join(d, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def flip_weight_bit(d) -> int:
    """Flip the lowest bit of one int8 weight byte of blk.0.ffn_up.q in
    d/model.safetensors; a byte in [0, 100] keeps the value in range, so
    every loader check but the sha256 passes. Returns the file offset."""
    path = os.path.join(d, "model.safetensors")
    st = SafetensorsFile(path)
    _, _, begin, _ = st._entries["blk.0.ffn_up.q"]
    w = st.get("blk.0.ffn_up.q").reshape(-1)
    i = next(k for k in range(w.size) if 0 <= w[k] <= 100)
    off = st._base + begin + i
    del st, w
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)[0]
        f.seek(off)
        f.write(bytes([b ^ 1]))
    return off


@pytest.fixture
def damaged(converted, tmp_path):
    d = str(tmp_path / "damaged")
    shutil.copytree(converted, d)
    flip_weight_bit(d)
    return d


def test_convert_records_the_sha256_loading_computes(converted):
    recorded = cfg_of(converted)["model_sha256"]
    assert recorded == sha256_file(os.path.join(converted, "model.safetensors"))
    assert Engine(load_model(converted)).lm.model_sha256 == recorded


def test_damaged_model_refused_by_the_api(damaged, monkeypatch):
    monkeypatch.delenv("INTDET_SKIP_SHA256_CHECK", raising=False)
    st = os.path.join(damaged, "model.safetensors")
    got = sha256_file(st)
    recorded = cfg_of(damaged)["model_sha256"]
    assert got != recorded
    want = (f"{st}: sha256 {got} does not match the {recorded} recorded in config.json at conversion "
            f"(the file is damaged or was changed; INTDET_SKIP_SHA256_CHECK=1 loads it anyway)")
    with pytest.raises(IntdetError) as e:
        LLM(damaged)
    assert str(e.value) == want and e.value.field == "model"
    with pytest.raises(IntdetError, match="does not match"):
        Engine(load_model(damaged), "ref")
    monkeypatch.setenv("INTDET_SKIP_SHA256_CHECK", "1")
    llm = LLM(damaged)
    assert llm.engine.lm.model_sha256 == got
    assert len(llm.generate([1, 2], SamplingParams(max_tokens=2)).tokens) == 2


def test_damaged_model_refused_by_the_cli(damaged, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "INTDET_SKIP_SHA256_CHECK"}
    env["INTDET_CACHE"] = str(tmp_path / "cache")
    cmd = [sys.executable, "-m", "intdet", "generate", "-m", damaged, "--ids", "1,2", "-n", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    st = os.path.join(damaged, "model.safetensors")
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith(f"intdet: error: {st}: sha256 ") and r.stderr.count("\n") == 1, r.stderr
    assert "recorded in config.json at conversion (the file is damaged or was changed" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, INTDET_SKIP_SHA256_CHECK="1"))
    assert r.returncode == 0, r.stderr


def test_model_without_a_record_loads_as_before(damaged):
    """A model converted before the record (the cache holds such) is not checked."""
    cfg = cfg_of(damaged)
    del cfg["model_sha256"]
    with open(os.path.join(damaged, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    eng = Engine(load_model(damaged))
    assert eng.lm.model_sha256 == sha256_file(os.path.join(damaged, "model.safetensors"))


@pytest.mark.parametrize("value", [42, "abc", "A" * 64])
def test_malformed_record_named(converted, tmp_path, value):
    d = str(tmp_path / "m")
    shutil.copytree(converted, d)
    cfg = cfg_of(d)
    cfg["model_sha256"] = value
    with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    with pytest.raises(IntdetError, match=r"config\.json: model_sha256 must be 64 lowercase hex digits"):
        load_model(d)


def test_record_leaves_the_chain_hash_alone(converted, tmp_path):
    """The chain hash covers model.safetensors' sha256 and the format version,
    not config.json: the same model with and without the record hashes alike."""
    d = str(tmp_path / "m")
    shutil.copytree(converted, d)
    cfg = cfg_of(d)
    del cfg["model_sha256"]
    with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    p = SamplingParams(max_tokens=4)
    assert LLM(d).generate([1, 2, 3], p).hash == LLM(converted).generate([1, 2, 3], p).hash
