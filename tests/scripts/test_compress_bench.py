"""scripts/bench_compress.py end to end on a tiny random model: every tool
round-trips, and the --ctx / --batches trade-off rows are there."""

import json
import os
import subprocess
import sys

import pytest

from intdet.convert import convert

pytestmark = pytest.mark.slow

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "bench_compress.py")


def test_bench_compress_rows(tiny_llama_hf, tmp_path):
    model = convert(tiny_llama_hf, str(tmp_path / "m"), progress=False)
    out = tmp_path / "rows.json"
    r = subprocess.run([sys.executable, BENCH, "-m", model, "--only", "python", "--bytes", "3000", "--threads", "1",
                        "--default-ctx", "64", "--batch", "4", "--ctx", "32", "--ctx-decompress", "--batches", "2",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {row["tool"]: row for row in json.loads(out.read_text())}
    assert {"gzip -9", "intdet ctx 64 batch 4", "intdet ctx 64 batch 2 (decompress)", "intdet ctx 32 batch 4"} <= set(rows)
    for tool, row in rows.items():
        assert row["ok"] is True, tool
        assert row["bytes"] <= 3000 and row["size"] > 0
    assert rows["intdet ctx 32 batch 4"]["chunks"] > rows["intdet ctx 64 batch 4"]["chunks"]
    assert "round-trip" in r.stdout and "FAILED" not in r.stdout
