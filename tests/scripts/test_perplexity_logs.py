"""scripts/perplexity_llamacpp.py --report: perplexities and ratios over
the windows every per-window log has finished (torn last lines ignored)."""

import json
import math
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "perplexity_llamacpp.py")


def _log(path, engine, nlls, torn=False):
    with open(path, "w") as f:
        for i, nll in nlls.items():
            f.write(json.dumps({"engine": engine, "i": i, "nll": nll, "tokens": 10, "nll_half": nll / 2,
                                "tokens_half": 5}) + "\n")
        if torn:
            f.write('{"engine": "')


def test_report_over_common_windows(tmp_path):
    _log(tmp_path / "f.jsonl", "float", {0: 20.0, 1: 30.0, 2: 25.0}, torn=True)
    _log(tmp_path / "i.jsonl", "integer", {0: 21.0, 1: 30.0})
    r = subprocess.run([sys.executable, SCRIPT, "--report", str(tmp_path / "f.jsonl"), str(tmp_path / "i.jsonl")],
                       capture_output=True, text=True, check=True)
    assert "windows finished by every engine: 2 (float 3, integer 2)" in r.stdout
    assert f"integer   perplexity {math.exp(51 / 20):.4f} over 20 tokens" in r.stdout
    assert f"integer / float: {math.exp(51 / 20) / math.exp(50 / 20):.4f}" in r.stdout
    _log(tmp_path / "x.jsonl", "integer", {5: 1.0})
    r = subprocess.run([sys.executable, SCRIPT, "--report", str(tmp_path / "f.jsonl"), str(tmp_path / "x.jsonl")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "share no finished window" in r.stderr
