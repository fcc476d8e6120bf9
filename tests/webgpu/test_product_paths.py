"""--device webgpu through the product's own paths: intdet.LLM (the
scheduler's continuous batching, greedy and sampled), ``intdet generate``
and ``intdet hash-check --device webgpu`` give the CPU's chain hashes for
every family of tests/families.py, Gemma 3 and int4 weights, on whatever
adapter is here (lavapipe in CI)."""

import json

import pytest
from click.testing import CliRunner

import families
import models
import intdet
from intdet.cli import main
from intdet.convert import convert

PROMPTS = [[5, 17, 99, 230, 41, 7, 300, 12], [64, 128, 3], [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 13, 17, 19, 23], [42]]
GREEDY = intdet.SamplingParams(max_tokens=6, temperature=0.0)
SAMPLED = intdet.SamplingParams(max_tokens=6, temperature=0.9, top_k=40, top_p=0.9, seed=11)
NAMES = sorted(families.FAMILIES) + ["gemma3", "int4"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            d = tmp_path_factory.mktemp(name)
            if name == "gemma3":
                src = models.write_hf_model(str(d / "hf"), "gemma3")
            elif name == "int4":
                src = models.write_hf_model(str(d / "hf"), "qwen3", **models.INT4_SHAPE)
            else:
                src = families.write_family(name, str(d / "hf"))
            cache[name] = convert(src, str(d / "int"), progress=False,
                                  **({"weights": "int4"} if name == "int4" else {}))
        return cache[name]

    return get


def hashes(path, device, params, max_batch):
    llm = intdet.LLM(path, device=device, max_batch=max_batch)
    return [c.hash for c in llm.generate(PROMPTS, params)], [c.tokens for c in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("name", NAMES)
def test_every_family_gives_the_cpu_hashes(model_dir, name):
    """Four prompts of different lengths in one scheduler, greedy and
    sampled, batches of 1 and 4: webgpu's tokens and chain hashes are the
    CPU's."""
    path = model_dir(name)
    for params in (GREEDY, SAMPLED):
        want = hashes(path, "cpu", params, 4)
        for mb in (1, 4):
            assert hashes(path, "webgpu", params, mb) == want, (name, params.temperature, mb)


def test_generate_cli_on_webgpu_prints_the_cpu_hash(model_dir):
    path = model_dir("qwen3")
    outs = {}
    for dev in ("cpu", "webgpu"):
        r = CliRunner().invoke(main, ["generate", "-m", path, "--ids", "5,17,99,230", "-n", "8", "--json",
                                      "--device", dev])
        assert r.exit_code == 0, r.output
        outs[dev] = json.loads(r.output.strip().splitlines()[-1])
    assert outs["webgpu"]["hash"] == outs["cpu"]["hash"] and outs["webgpu"]["tokens"] == outs["cpu"]["tokens"]


def test_hash_check_runs_the_webgpu_configurations(model_dir):
    """hash-check --device webgpu: prefill whole and split, inside batches,
    each against the CPU run; all equal."""
    r = CliRunner().invoke(main, ["hash-check", "-m", model_dir("mistral"), "--device", "webgpu", "--json",
                                  "--steps", "4", "--prompt", "hello"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output.strip().splitlines()[-1])
    configs = [x["config"] for x in res["runs"]]
    assert res["all_equal"] and len(configs) == 8 and any("inside a batch of 8" in c for c in configs), res
    assert configs[1].startswith("webgpu (") and configs[1].endswith("prefill whole"), configs


def test_batch_job_on_webgpu_writes_the_cpu_records(model_dir, tmp_path):
    """intdet batch (run_job, in this process) on webgpu: the same records,
    hashes included, as on the CPU."""
    from intdet.batch import run_job

    inp = tmp_path / "items.jsonl"
    inp.write_text('{"id": "a", "prompt": "the cat", "max_tokens": 5}\n'
                   '{"id": "b", "prompt": "a mat sat", "max_tokens": 5, "temperature": 0.8, "seed": 3}\n')
    recs = {}
    for dev in ("cpu", "webgpu"):
        out = tmp_path / f"{dev}.jsonl"
        run_job(str(inp), str(out), model=model_dir("llama3"), device=dev, workers=0, batch_size=2)
        recs[dev] = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs["cpu"]) == 2 and all("hash" in json.dumps(r) for r in recs["cpu"])
    assert recs["webgpu"] == recs["cpu"]
