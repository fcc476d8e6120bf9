"""`python -m intdet`, and `intdet random-model` from an installed package:
nothing may need the source checkout (scripts/, tests/) or the current
directory."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import site
import subprocess
import sys

import pytest

import intdet

# sha256 of `random-model --shape tiny-qwen3 --seed 0`, pinned from
# scripts/make_random_model.py before the generator moved into the package:
# the same seed keeps the same bytes.
TINY_QWEN3_SHA256 = {
    "config.json": "820c50da7ca20ae31eeaa199b1e62570c1c5b8769b9697bbbbb07e2a86aa6274",
    "generation_config.json": "4486d0ab64443027ebc29695454ede5efb78caac6ee6b6db613fe87fc9a1a9a7",
    "model.safetensors": "11a7dec8fddb42d85e9d1c3b2b4268df0dba67745ef2ea9c3e7f4d2d34e5ffff",
    "tokenizer.json": "3ca246f6d55a1e32ef15aae117ad648c93753725275a05c9b54f9bb06aadf11a",
    "tokenizer_config.json": "04b3cc4be09170edf672bc962fef87bdc20df87b5f2fa83cffd182b33be3c557",
}


def sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_python_m_intdet(tmp_path):
    r = subprocess.run([sys.executable, "-m", "intdet", "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and "version" in r.stdout, r.stderr
    # a command runs through the CLI's error handling: one line, exit 1
    r = subprocess.run([sys.executable, "-m", "intdet", "convert", "no-such-model.gguf", "-o", "out"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr.startswith("intdet: error:") and len(r.stderr.splitlines()) == 1, r.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The intdet package laid out as a wheel installs it, in a directory
    with no source checkout around it, and the environment to run it:
    ``python -S`` (no .pth files, so no editable-install hook) with
    PYTHONPATH = that directory, then this interpreter's site-packages."""
    root = tmp_path_factory.mktemp("site")
    dst = root / "intdet"
    for d in intdet.__path__:  # an editable install splits sources and the built extension
        shutil.copytree(d, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    assert importlib.util.find_spec("intdet._core") and list(dst.glob("_core*")), "no built extension to copy"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root)] + site.getsitepackages()), HF_HUB_OFFLINE="1")
    env.pop("INTDET_TEST_SIGNAL_AT", None)
    return root, env


def run_installed(installed, cwd, *args):
    root, env = installed
    env = dict(env, INTDET_CACHE=str(cwd / "cache"))
    return subprocess.run([sys.executable, "-S", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def test_installed_package_is_the_copy(installed, tmp_path):
    r = run_installed(installed, tmp_path, "-c", "import intdet, intdet._core; print(intdet.__file__)")
    assert r.returncode == 0, r.stderr
    assert os.path.dirname(r.stdout.strip()) == str(installed[0] / "intdet")


def test_random_model_runs_from_an_installed_package(installed, tmp_path):
    """random-model in a directory without scripts/: the same bytes as
    before, and they convert and generate."""
    assert not (tmp_path / "scripts").exists()
    r = run_installed(installed, tmp_path, "-m", "intdet", "random-model", "--shape", "tiny-qwen3", "hf")
    assert r.returncode == 0, r.stderr
    assert {n: sha256(tmp_path / "hf" / n) for n in sorted(os.listdir(tmp_path / "hf"))} == TINY_QWEN3_SHA256
    r = run_installed(installed, tmp_path, "-m", "intdet", "convert", "hf", "-o", "conv")
    assert r.returncode == 0, r.stderr
    r = run_installed(installed, tmp_path, "-m", "intdet", "generate", "-m", "conv", "--ids", "1,2,3", "-n", "4")
    assert r.returncode == 0, r.stderr
    assert re.search(r"generated 4 tok .* hash [0-9a-f]{12}$", r.stderr.strip()), r.stderr
    # the directory is left as it was, but for what was asked for
    assert sorted(os.listdir(tmp_path)) == ["conv", "hf"]


def test_random_model_refuses_a_non_empty_output(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    r = subprocess.run([sys.executable, "-m", "intdet", "random-model", "--shape", "tiny-llama", "out"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"intdet: error: {tmp_path / 'out'}: exists and is not an empty directory"], r.stderr
    assert os.listdir(tmp_path / "out") == ["notes.txt"] and sorted(os.listdir(tmp_path)) == ["out"]


def test_random_model_shapes_match_the_cli():
    from intdet.cli.random_model import random_model
    from intdet.random_model import SHAPES

    (shape,) = [p for p in random_model.params if p.name == "shape"]
    assert tuple(shape.type.choices) == SHAPES
