"""scripts/bench_intdet_gpu.py, intdet's rows of the device check (issue 50),
run on the CPU backend (the rehearsal's path): decode after a shared prompt
copied to every row, prefill, rows in the results format; a device this
build lacks is one error line."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "bench_intdet_gpu.py")


@pytest.fixture(scope="module")
def tiny_int(tiny_qwen3_hf, tmp_path_factory):
    from intdet.convert import convert

    return convert(tiny_qwen3_hf, str(tmp_path_factory.mktemp("int") / "m"), progress=False)


def test_rows_on_cpu(tmp_path, tiny_int):
    rows = tmp_path / "rows.jsonl"
    r = subprocess.run([sys.executable, SCRIPT, tiny_int, str(rows), "--model", "qwen3-0.6b", "--device", "cpu",
                        "--batches", "1,3", "--prompt", "9", "--steps", "2", "--prefill", "17"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [(x["engine"], x["backend"], x["phase"], x["batch"], x["tokens"]) for x in got] == [
        ("intdet", "cpu", "decode", 1, 9), ("intdet", "cpu", "decode", 3, 9), ("intdet", "cpu", "prefill", 1, 17)]
    assert all(x["tok_s"] > 0 for x in got)


def test_copied_prompt_decodes_like_a_prefilled_one(tiny_int):
    """The benchmark's shortcut (copy_prefix instead of a prefill per row)
    leaves every row where its own prefill would."""
    import numpy as np

    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from intdet.model import Engine, load_model

    eng = Engine(load_model(tiny_int), "cpu")
    rng = np.random.default_rng(3)
    prompt, nxt = rng.integers(0, eng.vocab_size, 9), rng.integers(0, eng.vocab_size, 1)
    a, b, c = eng.new_state(16), eng.new_state(16), eng.new_state(16)
    a.forward(prompt)
    b.copy_prefix(a, 9)
    c.forward(prompt)
    la, lb = eng.forward_batch([a, b], [nxt, nxt])
    assert np.array_equal(la, lb) and np.array_equal(lb, c.forward(nxt))


def test_missing_device_is_one_error_line(tmp_path, tiny_int):
    from intdet.model import DEVICES

    if "webgpu" in DEVICES:
        pytest.skip("this build has a webgpu device")
    r = subprocess.run([sys.executable, SCRIPT, tiny_int, str(tmp_path / "rows.jsonl"), "--model", "qwen3-0.6b",
                        "--device", "webgpu", "--batches", "1", "--prompt", "4", "--steps", "1", "--prefill", "8"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and r.stderr.startswith("bench_intdet_gpu: error: ") and r.stderr.count("\n") == 1
    assert not (tmp_path / "rows.jsonl").exists()
