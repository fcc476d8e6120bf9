"""``intdet random-model --jobs N`` (random_model.write_random_model(jobs=N)):
worker processes write pieces of the tensors at their offsets, and the files
are byte for byte those of the one-process writer (the large shapes'
checkpoints are written on the GPU machine in seconds; issue 50)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

from intdet import random_model as rm
from intdet.errors import IntdetError

TINY_LLAMA_SHA = "64fedce6321ef5c7ee4c6ab121d4171ea31b6a8e7abdaa6b66af4af01c188d53"  # test_models_fixture's pin


def _sha(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_jobs_give_the_pinned_bytes_in_many_pieces(tmp_path, monkeypatch):
    """Pieces of 1000 values: every tensor of tiny-llama but the norms is cut
    into several, written out of order by two processes."""
    monkeypatch.setattr(rm, "_PIECE", 1000)
    out = rm.write_random_model(str(tmp_path / "m"), "tiny-llama", jobs=2)
    assert _sha(os.path.join(out, "model.safetensors")) == TINY_LLAMA_SHA
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors",
                                       "tokenizer.json", "tokenizer_config.json"]


def test_sharded_checkpoint_with_a_pool_is_identical(tmp_path, monkeypatch):
    """The large shapes' layout (shards + index), on the tiny shape: every
    shard queued on the pool before any is waited for."""
    monkeypatch.setattr(rm, "_PIECE", 777)
    lines = []
    a = rm.write_hf_model(str(tmp_path / "a"), "qwen3", shard_bytes=60_000, torch_dtype="bfloat16")
    with ProcessPoolExecutor(3) as pool:
        b = rm.write_hf_model(str(tmp_path / "b"), "qwen3", shard_bytes=60_000, torch_dtype="bfloat16", pool=pool,
                              log=lines.append)
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b)) and sum(n.endswith(".safetensors") for n in names) > 2
    for n in names:
        assert _sha(os.path.join(a, n)) == _sha(os.path.join(b, n)), n
    n_tensors = len(rm.tensor_specs(rm.hf_config("qwen3")))
    assert len(lines) == n_tensors  # one line per tensor, as without a pool


def test_chunk_size_does_not_change_the_bytes(tmp_path):
    """The one-process writer's chunking (now 2^16 values) is invisible."""
    specs = rm.tensor_specs(rm.hf_config("llama"))
    rm.write_safetensors(str(tmp_path / "a"), specs, 0, bf16=False, chunk=4099)
    rm.write_safetensors(str(tmp_path / "b"), specs, 0, bf16=False)
    assert _sha(tmp_path / "a") == _sha(tmp_path / "b") == TINY_LLAMA_SHA


@pytest.mark.parametrize("jobs", [0, -2, 1.5, True])
def test_bad_jobs_refused(tmp_path, jobs):
    with pytest.raises(IntdetError) as e:
        rm.write_random_model(str(tmp_path / "m"), "tiny-llama", jobs=jobs)
    assert e.value.field == "jobs"
    assert not (tmp_path / "m").exists()


def test_worker_error_leaves_nothing(tmp_path, monkeypatch):
    """A piece that fails (here: the file is gone) fails the whole write,
    named by OUT, and no partial directory stays."""
    real = rm._submit_safetensors

    def submit_then_remove(path, *a):
        pieces = real(path, *a)
        os.unlink(path)  # the workers' open(O_WRONLY) fails
        return pieces

    monkeypatch.setattr(rm, "_submit_safetensors", submit_then_remove)
    monkeypatch.setattr(rm, "_PIECE", 1000)
    with pytest.raises(IntdetError, match="cannot write the checkpoint"):
        rm.write_random_model(str(tmp_path / "m"), "tiny-llama", jobs=2)
    assert os.listdir(tmp_path) == []


def test_cli_jobs(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "intdet", "random-model", str(tmp_path / "m"), "--shape", "tiny-llama",
                        "--jobs", "2"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert _sha(tmp_path / "m" / "model.safetensors") == TINY_LLAMA_SHA
    r = subprocess.run([sys.executable, "-m", "intdet", "random-model", str(tmp_path / "n"), "--jobs", "0"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "--jobs" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "n").exists()
