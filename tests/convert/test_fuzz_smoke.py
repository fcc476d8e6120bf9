"""A bounded run of each file-format fuzzer (tests/fuzz/): ~20 s each, both
at once, in subprocesses. INTDET_FUZZ_SECONDS changes the time;
scripts/fuzz.sh runs them for longer. A crash (any exception but
IntdetError, an out-of-memory or a per-input timeout) fails the test and
leaves its input under the test's tmp dir; replay it with
``python tests/fuzz/fuzz_<name>.py FILE``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # ~20 s of fuzzing per format

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
FUZZERS = ["gguf", "safetensors"]
SECONDS = float(os.environ.get("INTDET_FUZZ_SECONDS", "20"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Start every fuzzer at once; name -> (Popen, artifacts dir)."""
    base = tmp_path_factory.mktemp("fuzz")
    procs = {}
    for name in FUZZERS:
        art = base / name
        art.mkdir()
        procs[name] = (subprocess.Popen(
            [sys.executable, os.path.join(HERE, "fuzz", f"fuzz_{name}.py"), "--seconds", str(SECONDS),
             "--artifacts", str(art)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(base)), art)
    yield procs
    for p, _ in procs.values():
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("name", FUZZERS)
def test_fuzzer_finds_no_crash(runs, name):
    p, art = runs[name]
    try:
        out, _ = p.communicate(timeout=SECONDS + 180)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        pytest.fail(f"fuzz_{name} did not finish:\n{out.decode(errors='replace')[-4000:]}")
    text = out.decode("utf-8", errors="replace")
    crashes = sorted(n for n in os.listdir(art) if n.startswith("crash-"))
    assert p.returncode == 0 and not crashes, f"fuzz_{name} rc={p.returncode}, inputs {crashes} in {art}:\n{text[-6000:]}"
    assert "Uncaught Python exception" not in text, text[-6000:]
    # atheris ends with libFuzzer's "Done N runs", the plain loop with "fuzz: OK"
    assert "Done " in text or "fuzz: OK" in text, text[-3000:]
