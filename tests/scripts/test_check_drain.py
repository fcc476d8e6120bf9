"""scripts/check_drain.py on a tiny model: SIGTERM while 4 requests run
(the engine stalled in a step by the test hook, so the drain's deadline
ends them): every response whole, exit 0, and it says so."""

import json
import os
import subprocess
import sys

from intdet.convert import convert

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "check_drain.py")


def test_check_drain_reports_whole_responses(tmp_path, tiny_llama_hf):
    m = convert(tiny_llama_hf, str(tmp_path / "m"), progress=False)
    env = dict(os.environ, INTDET_TEST_STALL_AT="engine-step-3")
    r = subprocess.run([sys.executable, SCRIPT, "-m", m, "--clients", "4", "--words", "20", "--max-tokens", "100",
                        "--after", "2", "--", "--threads", "1", "--drain-timeout", "1"],
                       capture_output=True, text=True, timeout=300, env=env)
    out = json.loads(r.stdout)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert out["whole"] == 4 and out["finish_reasons"] == {"abort": 4} and out["exit_status"] == 0
