"""scripts/cuda_kernel_profile.py: the per-kernel table's sums and bounds
(the GPU part runs on the device only)."""

import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "cuda_kernel_profile", os.path.join(HERE, "..", "..", "scripts", "cuda_kernel_profile.py"))
prof = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prof)


def test_table_sums_steps_by_name_in_first_seen_order():
    steps = [("qkv", 2000, 4_000_000, 1), ("attn", 1000, 0, 2), ("qkv", 2000, 4_000_000, 1)]
    text = prof.table("decode", steps, 1, 4e12)
    lines = text.splitlines()
    qkv = next(line for line in lines if line.startswith("| qkv |"))
    # 2 launches, 4.0 us, 80% of 5 us, 8 MB, 8e6 B / 4000 ns = 2000 GB/s, 8e6 / 4e12 s = 2.0 us
    assert qkv == "| qkv | 2 | 4.0 | 80.0% | 8.00 | 2000 | 2.0 |"
    assert lines.index(qkv) < lines.index(next(line for line in lines if line.startswith("| attn |")))
    assert "| **total** | | 5.0 | | 8.0 | 1600 | 2.0 |" in lines
    assert "(3 steps, 4 launches)" in text
    # 1 token in 5 us; bound: 4e12 B/s / 8e6 B per token
    assert "event-timed: 200000 tok/s; bandwidth bound 500000 tok/s" in text


def test_table_without_time_or_bytes_has_no_division_by_zero():
    text = prof.table("empty", [("x", 0, 0, 1)], 4, 3.35e12)
    assert "event-timed: - tok/s; bandwidth bound - tok/s" in text
    assert "bound at 3.4 TB/s" in text


def test_arguments_are_checked_before_any_gpu_work(capsys):
    with pytest.raises(SystemExit) as e:
        prof.main(["model", "--ctx", "64,x"])
    assert e.value.code == 2
    assert "--ctx" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        prof.main(["model", "--prefill", "0"])
