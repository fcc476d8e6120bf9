"""intdet verify (cli/verify.py) on receipts from `intdet batch --receipts`
and `intdet generate --json`: all match on another kernel set
(INTDET_ISA) and thread count; a changed output id is named with its step;
another model's hash names the model; bad files are one-line errors."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ISAS
from intdet.convert import convert


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_llama_hf):
    return convert(tiny_llama_hf, str(tmp_path_factory.mktemp("verify") / "m"), progress=False)


def _run(*args, isa=None):
    env = dict(os.environ)
    if isa is not None:
        env["INTDET_ISA"] = isa
    return subprocess.run([sys.executable, "-m", "intdet", *args], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def batch_out(model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("vb")
    items = []
    for i in range(24):
        it = {"id": f"g{i}", "ids": [1 + i * 7 % 300, 7, 9 + i % 50], "max_tokens": 3 + i % 5}
        if i % 3:
            it.update(temperature=["0.8", "1.2"][i % 2], seed=i, top_k=[0, 40][i % 2], top_p="0.9")
        if i % 5 == 0:
            it.update(repeat_penalty="1.2")
        items.append(it)
    items.append({"id": "s", "task": "score", "context": "a b", "continuation": " c"})  # no receipt: skipped
    src = d / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in items))
    out = d / "out.jsonl"
    r = _run("batch", str(src), "-o", str(out), "-m", model_dir, "--receipts", "--workers", "0", "--batch-size", "8",
             isa=ISAS[-1])
    assert r.returncode == 0, r.stderr
    return out


def test_batch_receipts_verify_on_another_isa_and_threads(model_dir, batch_out):
    recs = [json.loads(x) for x in batch_out.read_text().splitlines()]
    gen = [x for x in recs if x["task"] == "generate"]
    assert all(x["result"]["receipt"]["output_ids"] == x["result"]["tokens"] for x in gen)
    gens = batch_out.parent / "gen.jsonl"
    gens.write_text("".join(json.dumps(x) + "\n" for x in gen))
    r = _run("verify", str(gens), "-m", model_dir, "--threads", "1", "--max-batch", "5", isa=ISAS[0])
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 24 and all(x.endswith(": match") for x in lines)
    assert lines[0] == f"{gens}:1 (id 'g0'): match"
    assert "24 receipt(s): 24 match, 0 mismatch" in r.stderr and f"({ISAS[0]})" in r.stderr
    assert ", 1 thread)" in r.stderr, r.stderr  # --threads 1: singular


def test_changed_token_and_model_are_named(model_dir, batch_out, tmp_path):
    gen = [json.loads(x) for x in batch_out.read_text().splitlines() if '"task":"generate"' in x]
    gen[4]["result"]["receipt"]["output_ids"][2] += 1
    gen[7]["result"]["receipt"]["model_sha256"] = "cd" * 32
    f = tmp_path / "bad.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in gen))
    r = _run("verify", str(f), "-m", model_dir, "-q", "--threads", "2")
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout
    assert lines[0].startswith(f"{f}:5 (id 'g4'): MISMATCH at step 3: the receipt has token ")
    assert lines[1].startswith(f"{f}:8 (id 'g7'): MISMATCH: model differs: the receipt's is sha256 cdcdcdcd")
    assert f"-m {model_dir} is sha256" in lines[1]
    assert "Traceback" not in r.stderr and "24 receipt(s): 22 match, 2 mismatch" in r.stderr


def test_records_without_receipts_are_skipped_and_a_bad_id_fails_alone(model_dir, batch_out, tmp_path):
    """The whole batch output (a score record and an error record beside the
    generate ones) verifies; an output id outside the vocabulary fails its
    own receipt only, at its step."""
    lines = batch_out.read_text().splitlines() + [json.dumps({"id": "bad", "task": "generate", "error": "x"})]
    f = tmp_path / "all.jsonl"
    f.write_text("\n".join(lines) + "\n")
    r = _run("verify", str(f), "-m", model_dir, "-q", "--threads", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 record(s) hold no receipt (skipped)" in r.stderr and "24 receipt(s): 24 match" in r.stderr
    gen = [json.loads(x) for x in lines if '"task":"generate"' in x]
    gen[1]["result"]["receipt"]["output_ids"][1] = 10 ** 6
    f.write_text("".join(json.dumps(x) + "\n" for x in gen))
    r = _run("verify", str(f), "-m", model_dir, "-q", "--threads", "2")
    assert r.returncode == 1 and "24 receipt(s): 23 match, 1 mismatch" in r.stderr, r.stdout + r.stderr
    assert r.stdout.splitlines() == [f"{f}:2 (id 'g1'): MISMATCH at step 2: output id 1000000 at step 2 is outside "
                                     "the vocabulary [0, 320)"]


def test_generate_json_and_server_shapes(model_dir, tmp_path):
    r = _run("generate", "-m", model_dir, "--ids", "5,6,7", "-n", "6", "--temperature", "0.9", "--seed", "4",
             "--json", "--step-hashes")
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout)
    rc = g["receipt"]
    assert rc["output_ids"] == g["tokens"] and rc["chain_hash"][:12] == g["hash"] and len(rc["step_hashes"]) == 6
    (tmp_path / "g.json").write_text(r.stdout)
    resp = {"choices": [{"index": 0, "receipt": rc}, {"index": 1, "receipt": dict(rc, step_hashes=None)}]}
    del resp["choices"][1]["receipt"]["step_hashes"]
    (tmp_path / "resp.json").write_text(json.dumps(resp, indent=1))  # one JSON value over several lines
    for name, n in (("g.json", 1), ("resp.json", 2)):
        v = _run("verify", str(tmp_path / name), "-m", model_dir)
        assert v.returncode == 0 and len(v.stdout.splitlines()) == n, v.stdout + v.stderr
    assert _run("generate", "-m", model_dir, "--ids", "5", "--step-hashes").returncode == 1


@pytest.mark.parametrize("content,msg", [
    (None, "no such file"),
    ("", "no receipts"),
    ('{"a": 1}\n', "holds no receipt"),
    ('{"receipt_version": 1}\n{\n', ":2: not JSON"),
    ('{"receipt_version": 1}', "not a receipt: no model_sha256"),
])
def test_bad_files_are_one_line_errors(model_dir, tmp_path, content, msg):
    f = tmp_path / "r.jsonl"
    if content is not None:
        f.write_text(content)
    r = _run("verify", str(f), "-m", model_dir)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("intdet: error: ") and msg in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
