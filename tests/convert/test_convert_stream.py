"""Streamed conversion (issue 37): source tensors read a block of rows at a
time (convert/lazy.py), quantized in parallel row blocks and written at
their offsets (convert/writer.py), with the same bytes as the whole-tensor
path; bounded memory; the pre-flight checks (preflight.py); sharded
checkpoints and the large random-model shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import families
import numpy as np
import pytest

from intdet.convert import convert
from intdet.convert import lazy
from intdet.convert import quantize as Q
from intdet.convert.sources import read_source
from intdet.errors import IntdetError


def _st_bytes(path):
    with open(path, "rb") as f:
        return f.read()


# ------------------------------------------------------------ LazyTensor


def test_lazy_tensor_ops_equal_numpy():
    """Every lazy spelling the architecture modules use gives numpy's values."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 10, 8)).astype(np.float32)
    t = lazy.from_array(a, "x", "f")
    assert t.shape == a.shape and t.nrows == 60 and t.ncols == 8
    assert np.array_equal(np.asarray(t), a)
    assert np.array_equal(np.asarray(t[2:5]), a[2:5])
    assert np.array_equal(np.asarray(t[:, 3:7]), a[:, 3:7])
    perm = rng.permutation(6)
    assert np.array_equal(np.asarray(t[perm]), a[perm])
    assert np.array_equal(np.asarray((t + 1.0).astype(np.float32)), (a + 1.0).astype(np.float32))
    m = np.float32(0.7)
    assert np.array_equal(np.asarray(t * m), a * m) and np.array_equal(np.asarray(t / m), a / m)
    parts = [lazy.from_array(a[i]) for i in range(6)]
    assert np.array_equal(np.asarray(lazy.stack(parts)), a)
    # rows of a derived tensor across part boundaries
    assert np.array_equal(lazy.stack(parts).rows(7, 23), a.reshape(60, 8)[7:23])
    w = rng.standard_normal((12, 5)).astype(np.float32)
    from intdet.models.llama import unpermute_rope_rows

    lw = lazy.from_array(w)
    got = lw[unpermute_rope_rows(np.arange(12), 3)]
    assert np.array_equal(np.asarray(got), unpermute_rope_rows(w, 3))


def test_lazy_tensor_reports_nan_when_read():
    a = np.ones((4, 3), np.float32)
    a[2, 1] = np.inf
    t = lazy.from_array(a, "blk.0.attn_q", "model.safetensors")
    t.rows(0, 2)  # the finite rows read fine
    with pytest.raises(IntdetError, match=r"^model.safetensors: tensor 'blk.0.attn_q' holds NaN or Inf values$"):
        t.rows(1, 3)


def test_quant_rows_int8_is_the_plain_expression():
    """The in-place quant_rows_int8 equals the textbook float64 expression,
    also for all-zero rows, tiny and huge magnitudes and float64 input."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 40)).astype(np.float32) * np.float32(10.0) ** rng.integers(-30, 30, (64, 1))
    w[5] = 0.0
    w[6] = -w[6]
    w[7, :] = np.float32(1e-38)  # subnormal steps: the clipped path
    for x in (w, w.astype(np.float64)):
        q, s = Q.quant_rows_int8(x)
        x64 = np.asarray(x, np.float64)
        s_ref = np.abs(x64).max(axis=1) / 127.0
        q_ref = np.clip(np.rint(x64 / np.where(s_ref > 0, s_ref, 1.0)[:, None]), -127, 127).astype(np.int8)
        assert np.array_equal(s, s_ref) and np.array_equal(q, q_ref)


# ------------------------------------------------ bytes: the package's layout


@pytest.fixture(scope="module")
def wide_moe_hf(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream")
    return families.write_family("qwen3-moe", str(d / "hf"), hidden_size=64, intermediate_size=128,
                                 moe_intermediate_size=64, head_dim=32)


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_streamed_file_is_what_safetensors_writes(wide_moe_hf, tmp_path, weights):
    """model.safetensors from the streamed writer equals, byte for byte, the
    safetensors package's save_file of the same tensors in memory, so the
    header layout, tensor order and padding are the package's."""
    from safetensors.numpy import save_file

    out = convert(wide_moe_hf, str(tmp_path / "m"), progress=False, weights=weights)
    tensors, _ = Q.quantize_model(read_source(wide_moe_hf), weights=weights)
    save_file(tensors, str(tmp_path / "ref.safetensors"), metadata={"format": "intdet"})
    assert _st_bytes(os.path.join(out, "model.safetensors")) == _st_bytes(tmp_path / "ref.safetensors")


def test_block_size_and_threads_do_not_change_a_byte(wide_moe_hf, tmp_path, monkeypatch):
    """Rows are quantized alone: 7-element blocks on 3 threads, or one block
    a tensor on one thread, write the same file."""
    import intdet.convert as C

    monkeypatch.setattr(C, "quantize_workers", lambda: 1)
    a = convert(wide_moe_hf, str(tmp_path / "a"), progress=False)
    monkeypatch.setattr(Q, "BLOCK_ELEMS", 7)
    monkeypatch.setattr(C, "quantize_workers", lambda: 3)
    b = convert(wide_moe_hf, str(tmp_path / "b"), progress=False)
    for f in ("model.safetensors", "config.json"):
        assert _st_bytes(os.path.join(a, f)) == _st_bytes(os.path.join(b, f))


def test_gguf_source_streams_the_same_bytes(tmp_path, monkeypatch):
    """A GGUF source (Q4_K rows dequantized a block at a time, Q/K rows
    un-permuted lazily) gives the whole-tensor path's bytes."""
    import models
    from safetensors.numpy import save_file

    src = models.write_gguf_model(str(tmp_path / "q4k.gguf"), "Q4_K")
    monkeypatch.setattr(Q, "BLOCK_ELEMS", 50)
    out = convert(src, str(tmp_path / "m"), progress=False, weights="int4")
    tensors, _ = Q.quantize_model(read_source(src), weights="int4")
    save_file(tensors, str(tmp_path / "ref.safetensors"), metadata={"format": "intdet"})
    assert _st_bytes(os.path.join(out, "model.safetensors")) == _st_bytes(tmp_path / "ref.safetensors")


def test_sharded_checkpoint_converts_as_one(tmp_path):
    """Shards with model.safetensors.index.json (as transformers writes a
    large model) give the single file's model."""
    from intdet.random_model import write_hf_model

    one = write_hf_model(str(tmp_path / "one"), "qwen3", torch_dtype="bfloat16")
    many = write_hf_model(str(tmp_path / "many"), "qwen3", torch_dtype="bfloat16", shard_bytes=40_000)
    shards = sorted(n for n in os.listdir(many) if n.endswith(".safetensors"))
    assert len(shards) > 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.load(open(os.path.join(many, "model.safetensors.index.json")))
    assert set(index["weight_map"].values()) == set(shards)
    a = convert(one, str(tmp_path / "a"), progress=False)
    b = convert(many, str(tmp_path / "b"), progress=False)
    assert _st_bytes(os.path.join(a, "model.safetensors")) == _st_bytes(os.path.join(b, "model.safetensors"))


# ------------------------------------------------------------ memory


_PEAK = r"""
import json, sys
import intdet.convert as C
C.convert(sys.argv[3], sys.argv[2] + "-warm", progress=False)  # every import conversion makes, before the baseline
def status(key):  # VmHWM: this process's peak (ru_maxrss would count the parent's, inherited at fork)
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
base = status("VmRSS")
C.convert(sys.argv[1], sys.argv[2], progress=False)
print(json.dumps({"base": base, "peak": status("VmHWM")}))
"""


def test_conversion_memory_does_not_grow_with_the_model(tmp_path):
    """A float32 checkpoint of ~200 MB converts with a peak RSS a fraction
    of its size above the process's baseline (the whole-tensor converter
    held every float tensor, ~2x the source, plus float64 copies)."""
    from intdet.random_model import write_hf_model

    src = write_hf_model(str(tmp_path / "hf"), "qwen3", hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=64, vocab_size=32000,
                         tie_word_embeddings=False)
    src_bytes = sum(os.path.getsize(os.path.join(src, n)) for n in os.listdir(src) if n.endswith(".safetensors"))
    assert src_bytes > 150e6
    tiny = write_hf_model(str(tmp_path / "tiny"), "qwen3")
    r = subprocess.run([sys.executable, "-c", _PEAK, src, str(tmp_path / "out"), tiny], capture_output=True, text=True,
                       timeout=300, check=True)
    m = json.loads(r.stdout.strip().splitlines()[-1])
    grew = m["peak"] - m["base"]
    assert grew < 0.35 * src_bytes, (grew, src_bytes, m)


# ------------------------------------------------------------ pre-flight


def test_preflight_disk_and_memory_refusals(tmp_path, monkeypatch):
    from intdet import preflight

    class St:
        f_bavail, f_frsize, f_blocks = 100_000, 4096, 10**6  # 410 MB free

    monkeypatch.setattr(os, "statvfs", lambda p: St)
    with pytest.raises(IntdetError, match=r"out: the converted model needs 1\.0 GiB but .+ has 0\.4 GiB free$"):
        preflight.check_convert(1 << 30, str(tmp_path / "out"))
    preflight.check_convert(1 << 20, str(tmp_path / "out"))  # 1 MB fits
    monkeypatch.undo()
    with pytest.raises(IntdetError, match=r"^convert: needs about 1\.0 GiB of memory, 0\.5 GiB available$"):
        preflight.check_convert(1, str(tmp_path / "out"), available=lambda: 1 << 29)

    big = {"blk.0.ffn_up.q": np.zeros(0, np.int8), "tok_embd.q": np.zeros(0, np.int8)}
    sizes = {"blk.0.ffn_up.q": 8 << 30, "tok_embd.q": 1 << 30}

    class Fake:
        def __init__(self, n):
            self.nbytes = n

    t = {k: Fake(v) for k, v in sizes.items()}
    assert preflight.load_estimate(t) == (9 << 30) + preflight.MARGIN
    with pytest.raises(IntdetError, match=r"^m/model.safetensors: loading needs about 9\.5 GiB of memory, 8\.0 GiB "
                                          r"available; --weights int4 needs about 6\.5 GiB$"):
        preflight.check_load({}, t, "m/model.safetensors", available=lambda: 8 << 30)
    with pytest.raises(IntdetError, match=r"4\.0 GiB available$"):  # int4 would not fit either: no hint
        preflight.check_load({}, t, "m/model.safetensors", available=lambda: 4 << 30)
    preflight.check_load({}, t, "m", available=lambda: 10 << 30)
    preflight.check_load({}, t, "m", available=lambda: None)  # unknown: no refusal
    monkeypatch.setenv("INTDET_SKIP_PREFLIGHT", "1")
    preflight.check_load({}, t, "m", available=lambda: 1)
    assert big  # (the arrays' own nbytes are 0: the estimate reads nbytes)


def test_preflight_names_the_model_in_the_cli(tmp_path):
    """generate on a model bigger than the memory the process is allowed
    (a cgroup would say so; here the estimate is compared with a tiny fake
    through the test hook) is one line naming the estimate."""
    import models

    src = models.write_gguf_model(str(tmp_path / "m.gguf"), "F32")
    out = convert(src, str(tmp_path / "m"), progress=False)
    code = ("import sys, intdet.preflight as P; P.mem_available = lambda: 1 << 20; from intdet.cli import main; "
            "sys.argv = ['intdet'] + sys.argv[1:]; main()")
    r = subprocess.run([sys.executable, "-c", code, "generate", "-m", out, "--ids", "1,2", "-n", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"intdet: error: {out}/model.safetensors: loading needs about 0.5 GiB of memory, "
                               "0.0 GiB available"), r.stderr


# ------------------------------------------------------ the large shapes


def test_large_random_shapes_are_models_intdet_reads():
    """The published sizes of qwen3-1.7b, qwen3-4b and llama3-8b (no GBs
    written here): intdet's reader takes each config, and the tensor table
    adds up to the real parameter counts."""
    from intdet import models as M
    from intdet.random_model import LARGE_SHAPES, hf_config, tensor_specs

    want = {"qwen3-1.7b": 1.72e9, "qwen3-4b": 4.02e9, "llama3-8b": 8.03e9}
    for shape, (arch, cfg, _) in LARGE_SHAPES.items():
        c = hf_config(arch, torch_dtype="bfloat16", **cfg)
        hp = M.by_hf_class(c["architectures"][0]).hparams_from_hf(c, "config.json")
        assert hp["hidden_size"] == cfg["hidden_size"] and hp["num_layers"] == cfg["num_hidden_layers"]
        n = sum(int(np.prod(s[1])) for s in tensor_specs(c))
        assert abs(n - want[shape]) / want[shape] < 0.01, (shape, n)


def test_preflight_reads_this_process_cgroup(tmp_path):
    """In a real memory cgroup (v1, as on these machines; root needed) of
    300 MiB, loading a model that needs 0.5 GiB by the estimate is refused
    in one line naming both numbers, instead of an OOM kill."""
    import models

    base = "/sys/fs/cgroup/memory"
    cg = os.path.join(base, f"intdet-test-{os.getpid()}")
    try:
        os.mkdir(cg)
    except OSError as e:
        pytest.skip(f"no writable memory cgroup here ({e.strerror})")
    try:
        with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
            f.write(str(300 << 20))
        out = convert(models.write_gguf_model(str(tmp_path / "m.gguf"), "F32"), str(tmp_path / "m"), progress=False)
        script = f'echo $$ > {cg}/cgroup.procs && exec "$0" -m intdet generate -m "$1" --ids 1,2 -n 1'
        r = subprocess.run(["sh", "-c", script, sys.executable, out], capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"intdet: error: {out}/model.safetensors: loading needs about 0.5 GiB of memory, "
                                   f"0.") and r.stderr.rstrip().endswith("GiB available"), r.stderr
    finally:
        for _ in range(50):
            try:
                os.rmdir(cg)
                break
            except OSError:
                import time

                time.sleep(0.1)
