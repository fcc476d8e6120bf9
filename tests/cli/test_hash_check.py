"""intdet hash-check on a tiny model: every configuration agrees, --expect
compares with another machine's hash, --float shows float diverging."""

import json
import os
import subprocess
import sys

import pytest

from intdet.convert import convert


@pytest.fixture(scope="module")
def model(tmp_path_factory, tiny_qwen3_hf):
    return convert(tiny_qwen3_hf, str(tmp_path_factory.mktemp("hc") / "m"), progress=False)


def hc(*args, cache):
    env = dict(os.environ, INTDET_CACHE=str(cache))
    return subprocess.run([sys.executable, "-m", "intdet.cli", "hash-check", *args], capture_output=True, text=True,
                          env=env)


def test_all_configurations_agree(model, tmp_path):
    r = hc("-m", model, "--prompt", "hello world", "--steps", "20", "--json", cache=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["all_equal"]
    greedy = [x for x in out["runs"] if x["group"] == "greedy"]
    configs = " | ".join(x["config"] for x in greedy)
    for part in ("scalar, 1 thread", "token by token", "chunks of 7", "batch of 4", "batch of 8"):
        assert part in configs
    assert len({x["hash"] for x in greedy}) == 1
    sampled = [x for x in out["runs"] if x["group"] == "sampled"]
    assert len(sampled) == 2 and sampled[0]["hash"] == sampled[1]["hash"] != greedy[0]["hash"]
    # --expect with the right hash passes, with another fails with exit 1.
    h = greedy[0]["hash"]
    assert hc("-m", model, "--prompt", "hello world", "--steps", "20", "--expect", h, cache=tmp_path).returncode == 0
    up = hc("-m", model, "--prompt", "hello world", "--steps", "20", "--expect", h.upper(), cache=tmp_path)
    assert up.returncode == 0 and f"--expect {h}: matches" in up.stdout, up.stderr  # hex in either case
    bad = hc("-m", model, "--prompt", "hello world", "--steps", "20", "--expect", "0" * 12, cache=tmp_path)
    assert bad.returncode == 1 and "DIFFERS" in bad.stdout


def test_float_matrix(tiny_qwen3_hf, tmp_path):
    r = hc("-m", tiny_qwen3_hf, "--prompt", "hello world", "--steps", "8", "--float", "--json", cache=tmp_path)
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)["runs"]
    floats = [x for x in runs if x["group"] == "float"]
    assert floats and floats[0]["config"].startswith("numpy float32")


def test_bad_arguments(model, tmp_path):
    r = hc("-m", model, "--expect", "xyz", cache=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("intdet: error: --expect")
    r = hc("-m", model, "--steps", "0", cache=tmp_path)
    assert r.returncode == 1 and "--steps" in r.stderr
    r = hc("-m", model, "--float", cache=tmp_path)
    assert r.returncode == 1 and "--float needs the source model" in r.stderr


def test_a_failing_engine_is_an_error_not_a_hash(model, monkeypatch):
    """The scheduler retires a request whose step raised (a server keeps
    serving the others); hash-check's runs must not hash what was cut short
    (a binding-limit error on one device once read as a wrong hash)."""
    from intdet.errors import IntdetError
    from intdet.hashcheck import run_one
    from intdet.model import Engine, load_model
    from intdet.sampling import Sampler

    eng = Engine(load_model(model))
    calls = []
    real = Engine.forward_batch

    def flaky(self, *a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("a buffer over the device's binding limit")
        return real(self, *a, **k)

    prompt = [5, 9, 11]
    ok = run_one(eng, prompt, 6, Sampler())
    monkeypatch.setattr(Engine, "forward_batch", flaky)
    with pytest.raises(IntdetError, match="engine failed during the run: .*binding limit"):
        run_one(eng, prompt, 6, Sampler(), batch=2)
    monkeypatch.setattr(Engine, "forward_batch", real)
    assert run_one(eng, prompt, 6, Sampler()).hash == ok.hash  # the engine is still usable
