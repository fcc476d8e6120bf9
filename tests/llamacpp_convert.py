"""llama.cpp's own converter (convert_hf_to_gguf.py) as the tests' GGUF
oracle: the family tests turn a Hugging Face checkpoint into a GGUF with the
program that writes the GGUFs users download, then read that file.

The converter comes from scripts/fetch_llamacpp_convert.sh (the llama.cpp
vendored in the llama-cpp-python sdist): INTDET_LLAMACPP_CONVERT names its
folder, else the script's default cache folder is used. Without it the tests
that need it skip, unless INTDET_REQUIRE_LLAMACPP_CONVERT=1 (CI), where they
fail.

The tiny test tokenizer is not in the converter's table of pre-tokenizer
hashes, so the run names one (``pre``) instead of failing on the hash."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

VERSION = "0.3.36"

# Runs the converter's own main() with get_vocab_base_pre answering `pre`.
_RUNNER = r"""
import runpy, sys
d, pre = sys.argv[1], sys.argv[2]
sys.path[:0] = [d, d + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = [d + "/convert_hf_to_gguf.py"] + sys.argv[3:]
runpy.run_path(d + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def converter_dir() -> str | None:
    d = os.environ.get("INTDET_LLAMACPP_CONVERT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "intdet", f"llama.cpp-convert-{VERSION}")
    return d if os.path.isfile(os.path.join(d, "convert_hf_to_gguf.py")) else None


def require_converter() -> str:
    d = converter_dir()
    if d is None:
        msg = "llama.cpp's convert_hf_to_gguf.py not found (bash scripts/fetch_llamacpp_convert.sh)"
        if os.environ.get("INTDET_REQUIRE_LLAMACPP_CONVERT") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return d


def convert_hf_to_gguf(hf_dir: str, out_path: str, outtype: str = "f32", pre: str = "qwen2") -> str:
    """Run llama.cpp's converter on hf_dir -> out_path (outtype f32, f16,
    bf16 or q8_0); returns out_path. Fails the test with the converter's
    output when it fails."""
    d = require_converter()
    env = dict(os.environ, NO_LOCAL_GGUF="1")  # the runner already put its gguf-py first
    r = subprocess.run([sys.executable, "-c", _RUNNER, d, pre, hf_dir, "--outfile", out_path, "--outtype", outtype],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        pytest.fail(f"convert_hf_to_gguf.py failed on {hf_dir}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return out_path
