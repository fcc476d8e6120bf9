"""scripts/hash_batches.py: the pinned hash inside each batch size of the
device benchmark (issue 50), run on the CPU backend with a tiny model: the
hash of the generation alone is found inside batches of 3 and 5, and a
wrong --expect fails naming both hashes."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "hash_batches.py")


@pytest.fixture(scope="module")
def tiny_int(tiny_llama_hf, tmp_path_factory):
    from intdet.convert import convert

    return convert(tiny_llama_hf, str(tmp_path_factory.mktemp("int") / "m"), progress=False)


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300)


def test_batches_give_the_hash_alone(tiny_int):
    r = _run(tiny_int, "--device", "cpu", "--expect", "0" * 12, "--batches", "1", "--steps", "6")
    assert r.returncode == 1 and "DIFFERS from 000000000000" in r.stdout, r.stdout + r.stderr
    alone = re.search(r"batch of +1: ([0-9a-f]{12})", r.stdout).group(1)
    r = _run(tiny_int, "--device", "cpu", "--expect", alone, "--batches", "1,3,5", "--steps", "6")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(f"{alone} matches") == 3


def test_cli_hash_check_agrees(tiny_int):
    """The same prompt and steps as `intdet hash-check`: its pinned hash is this one."""
    hc = subprocess.run([sys.executable, "-m", "intdet", "hash-check", "-m", tiny_int, "--steps", "6", "--json"],
                        capture_output=True, text=True, timeout=600)
    assert hc.returncode == 0, hc.stderr
    import json

    want = json.loads(hc.stdout)["runs"][0]["hash"]
    r = _run(tiny_int, "--device", "cpu", "--expect", want, "--batches", "2", "--steps", "6")
    assert r.returncode == 0, r.stdout + r.stderr


def test_bad_device_and_expect(tiny_int):
    from intdet.model import DEVICES

    if "webgpu" in DEVICES:
        pytest.skip("this build has a webgpu device")
    r = _run(tiny_int, "--device", "webgpu", "--expect", "0" * 12)
    assert r.returncode == 1 and r.stderr.startswith("hash_batches: error: ") and r.stderr.count("\n") == 1
    r = _run(tiny_int, "--device", "cpu", "--expect", "xyz")
    assert r.returncode == 2 and "--expect: 'xyz' is not a 12-hex-digit hash" in r.stderr
