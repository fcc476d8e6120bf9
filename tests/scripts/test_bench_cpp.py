"""The C++ microbenchmarks in scripts/ build against the installed core's
static library and give the same output hash on every kernel set the CPU
runs (each prints a hash of its results: a kernel set that changed a bit
would print another). Skips where the build tree or g++ is absent."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sysconfig

import pytest

from intdet import _core

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _library() -> str | None:
    tag = sysconfig.get_config_var("SOABI")  # e.g. cpython-311-x86_64-linux-gnu
    libs = sorted(glob.glob(os.path.join(ROOT, "build", "*", "libintdet_core.a")))
    # the build tree of this interpreter (build/{wheel_tag}, e.g. cp311-cp311-linux_x86_64)
    mine = [p for p in libs if tag and tag.split("-")[1] in os.path.basename(os.path.dirname(p))]
    return (mine or libs or [None])[0]


LIB = _library()
pytestmark = pytest.mark.skipif(LIB is None or shutil.which("g++") is None,
                                reason="needs g++ and the core's build tree (build/*/libintdet_core.a)")


def _build(tmp_path, name: str) -> str:
    exe = str(tmp_path / name)
    subprocess.run(["g++", "-O1", "-std=c++20", "-I", os.path.join(ROOT, "csrc", "include"),
                    os.path.join(ROOT, "scripts", name + ".cpp"), LIB, "-fopenmp", "-o", exe],
                   check=True, capture_output=True, text=True)
    return exe


def _hash(out: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith("hash ")]
    assert len(lines) == 1, out
    return lines[0]


def test_bench_attend_layer_same_hash_on_every_set(tmp_path):
    exe = _build(tmp_path, "bench_attend_layer")
    hashes = {}
    for isa in _core.available_isas():
        for ctx, rows in ((300, 1), (300, 40), (1100, 2)):  # the per-head, tile and split-key paths
            r = subprocess.run([exe, isa, str(ctx), "2", "1", str(rows)], check=True, capture_output=True, text=True)
            hashes.setdefault((ctx, rows), set()).add(_hash(r.stdout))
    assert all(len(h) == 1 for h in hashes.values()), hashes


def test_bench_linear_same_hash_on_every_packed_set(tmp_path):
    exe = _build(tmp_path, "bench_linear")
    got = {}
    for isa in _core.available_isas():
        r = subprocess.run([exe, isa, "48", "37", "2", "16", "3"], capture_output=True, text=True)
        if r.returncode == 2 and "usage" in r.stderr:
            continue  # a set without a packed linear (scalar)
        assert r.returncode == 0, r.stderr
        assert "GMAC/s" in r.stdout and "two fixed halves" in r.stdout
        got[isa] = _hash(r.stdout)
    if not got:
        pytest.skip("no kernel set with a packed linear on this CPU")
    assert len(set(got.values())) == 1, got


@pytest.mark.skipif("amx" not in _core.available_isas(), reason="this CPU lacks AMX-INT8")
def test_bench_amx_linear_gives_the_avx512_outputs(tmp_path):
    exe = _build(tmp_path, "bench_amx_linear")
    for args in (["40", "100", "48", "16"], ["17", "577", "33", "32"]):
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.strip().endswith("same outputs: yes"), r.stdout
