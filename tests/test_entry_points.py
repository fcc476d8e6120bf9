"""`python -m intdet`."""

from __future__ import annotations

import os
import subprocess
import sys


def test_python_m_intdet(tmp_path):
    r = subprocess.run([sys.executable, "-m", "intdet", "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and "version" in r.stdout, r.stderr
    # a command runs through the CLI's error handling: one line, exit 1
    r = subprocess.run([sys.executable, "-m", "intdet", "convert", "no-such-model.gguf", "-o", "out"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr.startswith("intdet: error:") and len(r.stderr.splitlines()) == 1, r.stderr
