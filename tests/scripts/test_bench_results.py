"""scripts/bench_results.py: the device check's rows, the llama.cpp programs'
JSONL parsed into rows, the results JSON and the ratio table (issue 50)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import bench_results as br  # noqa: E402

# Lines as the vendored llama-bench's jsonl_printer and batched-bench's --output-format jsonl write
# them (fields abridged), among the log lines that share the stream.
_LB = dict(build_commit="0c1e570", model_type="qwen3 0.6B Q8_0", n_gpu_layers=99, flash_attn=True, stddev_ns=1000)
LLAMA_BENCH = "\n".join([
    "ggml_cuda_init: found 1 CUDA devices:", "  Device 0: NVIDIA H100 80GB HBM3, compute capability 9.0, VMM: no",
    json.dumps(dict(_LB, n_prompt=2048, n_gen=0, n_depth=0, avg_ns=40000000, avg_ts=51200.5, stddev_ts=12.0,
                    samples_ns=[40000000, 40000000], samples_ts=[51200.5, 51200.5])),
    json.dumps(dict(_LB, n_prompt=0, n_gen=128, n_depth=0, avg_ns=300000000, avg_ts=426.25, stddev_ts=1.5,
                    samples_ns=[300000000], samples_ts=[426.25])), ""])
_BB = dict(n_kv_max=147456, n_batch=2048, n_ubatch=512, flash_attn=1, is_pp_shared=1, n_gpu_layers=99, n_threads=16,
           n_threads_batch=16, pp=512, tg=64, t_pp=0.01, speed_pp=51200.0)
BATCHED = "\n".join([
    "llama_context: n_ctx = 147456",
    json.dumps(dict(_BB, pl=1, n_kv=576, t_tg=0.16, speed_tg=400.0, t=0.17, speed=3388.235294)),
    json.dumps(dict(_BB, pl=8, n_kv=1024, t_tg=0.2, speed_tg=2560.0, t=0.21, speed=4876.190476)), "", "main: done", ""])


def test_make_row_checks_every_field():
    r = br.make_row("intdet", "qwen3-0.6b", "decode", 8, 512, 1234.567)
    assert r == {"engine": "intdet", "model": "qwen3-0.6b", "phase": "decode", "batch": 8, "tokens": 512,
                 "tok_s": 1234.57, "backend": "cuda"}
    bad = [(("vllm", "qwen3-0.6b", "decode", 1, 0, 1.0), "engine"), (("intdet", "gpt2", "decode", 1, 0, 1.0), "model"),
           (("intdet", "qwen3-0.6b", "train", 1, 0, 1.0), "phase"), (("intdet", "qwen3-0.6b", "decode", 0, 0, 1.0), "batch"),
           (("intdet", "qwen3-0.6b", "decode", True, 0, 1.0), "batch"),
           (("intdet", "qwen3-0.6b", "prefill", 8, 2048, 1.0), "batch"),
           (("intdet", "qwen3-0.6b", "decode", 1, -1, 1.0), "tokens"),
           (("intdet", "qwen3-0.6b", "decode", 1, 0, float("nan")), "tok_s"),
           (("intdet", "qwen3-0.6b", "decode", 1, 0, 0.0), "tok_s")]
    for args, field in bad:
        with pytest.raises(ValueError, match=f"^{field}:"):
            br.make_row(*args)
    with pytest.raises(ValueError, match="^backend:"):
        br.make_row("intdet", "qwen3-0.6b", "decode", 1, 0, 1.0, backend="metal")


def test_llama_bench_and_batched_bench_rows():
    assert br.llama_bench_rows(LLAMA_BENCH, "qwen3-0.6b") == [
        br.make_row("llama.cpp", "qwen3-0.6b", "prefill", 1, 2048, 51200.5),
        br.make_row("llama.cpp", "qwen3-0.6b", "decode", 1, 0, 426.25)]
    assert br.batched_bench_rows(BATCHED, "llama3-8b") == [
        br.make_row("llama.cpp", "llama3-8b", "decode", 1, 512, 400.0),
        br.make_row("llama.cpp", "llama3-8b", "decode", 8, 512, 2560.0)]
    assert br.batched_bench_rows("error: failed to load model\n", "llama3-8b") == []


def test_ratios_pair_equal_keys_only():
    rows = [br.make_row("intdet", "qwen3-0.6b", "decode", 1, 512, 300.0),
            br.make_row("llama.cpp", "qwen3-0.6b", "decode", 1, 512, 400.0),
            br.make_row("torch", "qwen3-0.6b", "decode", 1, 512, 150.0),
            br.make_row("llama.cpp", "qwen3-0.6b", "decode", 1, 0, 450.0),  # tg128 from depth 0: no intdet twin
            br.make_row("intdet", "qwen3-0.6b", "decode", 1, 512, 10.0, backend="webgpu"),  # not a CUDA rate
            br.make_row("intdet", "llama3-8b", "prefill", 1, 2048, 5000.0)]
    got = br.ratios(rows)
    assert got == [
        {"model": "llama3-8b", "phase": "prefill", "batch": 1, "tokens": 2048, "intdet": 5000.0, "llama.cpp": None,
         "torch": None, "vs_llama.cpp": None, "vs_torch": None},
        {"model": "qwen3-0.6b", "phase": "decode", "batch": 1, "tokens": 512, "intdet": 300.0, "llama.cpp": 400.0,
         "torch": 150.0, "vs_llama.cpp": 0.75, "vs_torch": 2.0}]


def test_write_cli_json_and_markdown(tmp_path):
    rows = tmp_path / "rows.jsonl"
    for r in (br.make_row("intdet", "llama3-8b", "decode", 64, 512, 2000.0),
              br.make_row("torch", "llama3-8b", "decode", 64, 512, 4000.0)):
        br.append_row(str(rows), r)
    (tmp_path / "lb.txt").write_text(LLAMA_BENCH)
    (tmp_path / "bb.txt").write_text(BATCHED)
    script = os.path.join(ROOT, "scripts", "bench_results.py")
    for cmd in (["add-llama-bench", str(rows), "qwen3-0.6b", str(tmp_path / "lb.txt")],
                ["add-batched-bench", str(rows), "llama3-8b", str(tmp_path / "bb.txt")]):
        r = subprocess.run([sys.executable, script, *cmd], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    md = tmp_path / "res.md"
    md.write_text("# results\n")
    out = tmp_path / "res.json"
    r = subprocess.run([sys.executable, script, "write", str(rows), "--device", "NVIDIA H100 80GB HBM3",
                        "--hashes-equal", "yes", "--json", str(out), "--md", str(md)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["device"] == "NVIDIA H100 80GB HBM3" and res["hashes_equal"] is True
    assert len(res["rows"]) == 6 and {r["engine"] for r in res["rows"]} == {"intdet", "torch", "llama.cpp"}
    assert set(res["rows"][0]) == {"engine", "model", "phase", "batch", "tokens", "tok_s", "backend"}
    assert "| llama3-8b | decode | 64 | 512 | 2000.0 | - | 4000.0 | - | 0.50x |" in r.stdout
    assert md.read_text().startswith("# results\n") and "| llama3-8b | decode | 64 |" in md.read_text()
    assert not os.path.exists(str(out) + ".partial")


def test_cli_errors_name_the_file(tmp_path):
    script = os.path.join(ROOT, "scripts", "bench_results.py")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"engine": "intdet", "model": "qwen3-0.6b", "phase": "decode", "batch": 0, "tokens": 1, "tok_s": 1}\n')
    r = subprocess.run([sys.executable, script, "write", str(rows), "--device", "x", "--hashes-equal", "no",
                        "--json", str(tmp_path / "o.json")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr == f"bench_results: error: {rows}:1: batch: 0 must be an integer >= 1\n"
    assert not (tmp_path / "o.json").exists()
    (tmp_path / "empty.txt").write_text("CUDA error: out of memory\n")
    r = subprocess.run([sys.executable, script, "add-batched-bench", str(rows), "llama3-8b", str(tmp_path / "empty.txt")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "empty.txt: no result line found" in r.stderr


def test_ratios_of_one_backend():
    """The rehearsal's rows (backend cpu) pair among themselves, never with CUDA rows."""
    rows = [br.make_row("intdet", "qwen3-0.6b", "decode", 1, 512, 30.0, "cpu"),
            br.make_row("torch", "qwen3-0.6b", "decode", 1, 512, 10.0, "cpu"),
            br.make_row("torch", "qwen3-0.6b", "decode", 1, 512, 99.0)]
    assert [(d["intdet"], d["torch"], d["vs_torch"]) for d in br.ratios(rows, "cpu")] == [(30.0, 10.0, 3.0)]
    assert br.ratios(rows) == []
    assert {r["backend"] for r in br.batched_bench_rows(BATCHED, "llama3-8b", "cpu")} == {"cpu"}
    assert "Ratios on cpu:" in br.markdown(br.results("x", False, rows), "cpu")
