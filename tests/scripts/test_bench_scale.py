"""scripts/bench_scale.py: the table from a run's JSON, and the bandwidth
probe (scripts/bench_bandwidth.c) compiles and reports a number."""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_table_from_json(tmp_path):
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler for the bandwidth probe")
    res = {"shape": "qwen3-1.7b", "source_bytes": 3 << 30,
           "intdet_convert": {"seconds": 8.0, "peak_rss_bytes": 300 << 20, "output_bytes": 1 << 30},
           "llamacpp_convert": {"seconds": 20.0, "peak_rss_bytes": 2 << 30, "output_bytes": 1 << 30},
           "intdet_load": {"load_s": 7.0, "rss_bytes": 1 << 30, "peak_rss_bytes": 1 << 30},
           "speed": {"intdet": {"prefill_tok_s": 100.0, "decode_tok_s": 10.0},
                     "llama_bench": {"prefill_tok_s": 50.0, "decode_tok_s": 5.0}},
           "weight_bytes_per_token": 10**9, "decode_gb_s": 10.0}
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"threads": 1, "bandwidth_bytes_s": 1.0, "results": [res]}))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_scale.py"), "--table-from", str(p),
                        "--work-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    row = [ln for ln in r.stdout.splitlines() if ln.startswith("| qwen3-1.7b")][0]
    assert "8.0 / 0.29 GiB" in row and "2.50x" in row and "100.0 / 50.0 = 2.00x" in row and "10.00 / 5.00 = 2.00x" in row
    bw = float(r.stdout.split("read bandwidth ")[1].split(" GB/s")[0])
    assert bw > 0.1  # a real measurement (GB/s) of this machine
