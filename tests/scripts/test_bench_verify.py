"""scripts/bench_verify.py on a tiny model: receipts from a batch on one
kernel set verify on another at another thread count, and the tampered
record is named at its step."""

import json

from conftest import ISAS, load_script
from intdet.convert import convert


def test_bench_verify_small(tmp_path, tiny_llama_hf, capsys):
    model = convert(tiny_llama_hf, str(tmp_path / "m"), progress=False)
    bench = load_script("bench_verify")
    rc = bench.main(["-n", "14", "-m", model, "--max-tokens", "3", "--gen-isa", ISAS[-1], "--gen-threads", "2",
                     "--verify-isa", ISAS[0], "--verify-threads", "1", "--batch", "5", "--dir", str(tmp_path / "w")])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    assert out["receipts"] == 14 and out["all_match"] and out["tampered_named"]
    assert "14 receipt(s): 14 match, 0 mismatch" in out["verify_summary"] and ISAS[0] in out["verify_summary"]
    assert len({json.dumps(x, sort_keys=True) for x in bench.items(14, 3)}) == 14  # distinct items
