"""intdet batch (python/intdet/batch): item schema, per-item errors, the
resumable output file, and the same bytes from every engine: serial in this
process, the local worker pool, Ray Data (local mode, 2 CPUs) and a Dask
LocalCluster (2 workers), whatever the batch size."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import intdet
from intdet.batch.items import parse_line
from intdet.batch.output import open_output, summarize
from intdet.batch.runner import run_job
from intdet.convert import convert
from intdet.errors import IntdetError
from intdet.logprobs import LogSoftmax
from intdet.perplexity import window_nll

N_GOOD = 246  # 240 of generate, score and perplexity, then 6 of compress


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_llama_hf):
    return convert(tiny_llama_hf, str(tmp_path_factory.mktemp("batch") / "m"), progress=False)


def mixed_items():
    """N_GOOD items of every task and input kind, then bad lines."""
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "ran", "off"]
    out = []
    for i in range(240):
        text = " ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 9))
        k = i % 8
        if k == 0:
            d = {"id": f"g{i}", "prompt": text, "max_tokens": 1 + i % 6}
        elif k == 1:
            d = {"id": f"t{i}", "ids": [1 + i % 300, 7, 9 + i % 50], "max_tokens": 5, "temperature": 0.8, "seed": i,
                 "top_k": 40, "logprobs": 2}
        elif k == 2:
            d = {"id": i, "messages": [{"role": "user", "content": text}], "max_tokens": 3, "stop": ["a"]}
        elif k == 3:
            d = {"id": f"s{i}", "task": "score", "context": text, "continuation": " mat", "top": 1 + i % 3}
        elif k == 4:
            d = {"id": f"k{i}", "task": "score", "context": [5, 6, 7 + i % 9], "continuation": [8, 9]}
        elif k == 5:
            d = {"id": f"p{i}", "task": "perplexity", "text": text + " " + text}
        elif k == 6:
            d = {"id": f"w{i}", "task": "perplexity", "ids": [(i * 13 + j) % 320 for j in range(40)], "ctx": 16}
        else:
            d = {"id": f"r{i}", "prompt": text, "max_tokens": 4, "temperature": "1.3", "top_p": 0.9, "seed": 3,
                 "repeat_penalty": 1.1}
        out.append(json.dumps(d))
    for i in range(6):
        out.append(json.dumps({"id": f"z{i}", "task": "compress", "text": "the cat sat on the mat. " * (1 + 7 * i),
                               "ctx": 16 + 8 * i, "return_data": i % 2 == 0}))
    out += [
        "{not json",
        '[1, 2]',
        '{"prompt": "no id"}',
        '{"id": 1.5, "prompt": "x"}',
        '{"id": "u1", "task": "translate", "text": "x"}',
        '{"id": "u2", "prompt": "x", "max_tokes": 3}',
        '{"id": "u3", "prompt": "x", "ids": [1]}',
        '{"id": "u4", "prompt": "' + "word " * 300 + '", "max_tokens": 2}',  # past the 256-token context
        '{"id": "u5", "ids": [5, 999], "max_tokens": 2}',  # outside the vocabulary
        '{"id": "u6", "prompt": "x", "temperature": -1}',
        '{"id": "u7", "task": "perplexity", "text": "' + "word " * 300 + '"}',
        '{"id": "u8", "task": "score", "context": "x", "continuation": ""}',
        '{"id": "g0", "prompt": "a duplicate id"}',
        '{"id": "u9", "task": "compress", "text": "x", "ctx": 999}',
        "",
    ]
    return out


@pytest.fixture(scope="module")
def items_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("batch_in") / "items.jsonl"
    p.write_text("\n".join(mixed_items()) + "\n")
    return str(p)


@pytest.fixture(scope="module")
def serial(model_dir, items_file, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("batch_out") / "serial.jsonl")
    summary = run_job(items_file, out, model=model_dir, workers=0, batch_size=7, threads=1)
    with open(out, "rb") as f:
        return out, f.read(), summary


def records(data: bytes) -> list:
    return [json.loads(line) for line in data.splitlines()]


def by_id(data: bytes) -> list:
    """Lines sorted by (id, line), as bytes."""
    return sorted(data.splitlines(), key=lambda b: (json.dumps(json.loads(b)["id"]), json.loads(b).get("line", 0)))


# ---------------------------------------------------------------- schema


def test_parse_line_errors_name_the_line_or_field():
    seen = {}
    assert parse_line(0, "   ", "generate", seen) is None
    cases = [("{x", "line 2: invalid JSON"), ("3", "line 2: expected a JSON object, got int"),
             ('{"prompt": "a"}', "line 2: no 'id' field"), ('{"id": true, "prompt": "a"}', "line 2: id: True"),
             ('{"id": 1, "task": "x"}', "task: 'x' is not one of"), ('{"id": 2, "promt": "a"}', "promt: not a field"),
             ('{"id": 3}', "give exactly one of prompt, messages, ids"), ('{"id": 4, "ids": [1, "2"]}', "ids: must be"),
             ('{"id": 5, "task": "score", "context": "a"}', "continuation: missing"),
             ('{"id": 6, "task": "score", "context": "a", "continuation": "b", "top": -1}', "top: -1"),
             ('{"id": 7, "task": "perplexity", "text": "a", "ctx": 1}', "ctx: 1 must be"),
             ('{"id": 8, "task": "compress"}', "text: must be a string"),
             ('{"id": 9, "prompt": "a \\ud800"}', "line 2: a string holds a lone surrogate (U+D800)"),
             ('{"id": "\\udfff", "prompt": "a"}', "line 2: a string holds a lone surrogate (U+DFFF)"),
             (b'{"id": 10, "prompt": "caf\xe9"}', "line 2: not valid UTF-8 (byte 25)"),  # was run as "caf\ufffd"
             (b'\xff\xfe{"id": 11}', "line 2: not valid UTF-8 (byte 0)")]
    for line, msg in cases:
        it = parse_line(1, line, "generate", seen)
        assert msg in it.error, (line, it.error)
    ok = parse_line(2, '{"id": "a", "prompt": "hi", "max_tokens": 2}', "generate", seen)
    assert (ok.error, ok.id, ok.task, ok.fields) == ("", "a", "generate", {"prompt": "hi", "max_tokens": 2})
    dup = parse_line(5, '{"id": "a", "prompt": "again"}', "generate", seen)
    assert dup.error == 'line 6: id "a" is also the id of line 3' and dup.key == "line:6"
    assert parse_line(6, '{"id": "b", "text": "t"}', "perplexity", seen).task == "perplexity"


# ---------------------------------------------------------------- results


def test_records_are_the_api_results(serial, model_dir):
    _, data, summary = serial
    recs = {json.dumps(r["id"]): r for r in records(data) if "line" not in r}
    llm = intdet.load(model_dir)
    g = recs['"g8"']["result"]
    c = llm.generate(json.loads(mixed_items()[8])["prompt"], intdet.SamplingParams(max_tokens=3))
    assert (g["tokens"], g["hash"], g["text"], g["finish_reason"]) == (c.tokens, c.hash, c.text, c.finish_reason)
    t = recs['"t9"']["result"]
    c = llm.generate([10, 7, 18], intdet.SamplingParams(max_tokens=5, temperature=0.8, seed=9, top_k=40, logprobs=2))
    assert t["tokens"] == c.tokens and t["hash"] == c.hash
    assert [x["logprob_q"] for x in t["logprobs"]] == [x.logprob_q for x in c.logprobs]
    assert t["cumulative_logprob_q"] == sum(x.logprob_q for x in c.logprobs)
    s = recs['"k4"']["result"]
    sc = llm.score([5, 6, 11], [8, 9])
    assert (s["logprob_q"], s["is_greedy"], s["hash"], s["tokens"]) == (sc.logprob_q, sc.is_greedy, sc.hash, [8, 9])
    # perplexity: the NLL of each window from the engine's int32 logits by logprobs.LogSoftmax, and near the float one
    ids = [(6 * 13 + j) % 320 for j in range(40)]
    want, flt = 0, 0.0
    for w in (ids[:16], ids[16:32]):  # ctx 16: the last 8 tokens are dropped (perplexity.windows_of)
        logits = llm.engine.new_state(16).forward(w, all_logits=True)
        ls = LogSoftmax(np.asarray(logits, dtype=np.int32))
        want -= sum(ls.logprob_q(j, w[j + 1]) for j in range(15))
        flt += window_nll(logits.astype(np.float64) / 65536.0, w)
    p = recs['"w6"']["result"]
    assert (p["nll_q"], p["tokens"], p["windows"]) == (want, 30, 2)
    assert abs(p["nll"] - flt) < 30 * 6e-6
    # compress: the container of intdet.compress, and it decompresses to the text
    import base64
    import hashlib
    import io

    from intdet.compress import codec

    z = recs['"z4"']["result"]
    text = "the cat sat on the mat. " * 29
    blob = io.BytesIO()
    st = codec.compress_stream(llm.engine, io.BytesIO(text.encode()).read, blob, ctx=48)
    want = (st.out_bytes, hashlib.sha256(blob.getvalue()).hexdigest(), st.chunks)
    assert (z["compressed_bytes"], z["sha256"], z["chunks"]) == want
    back = io.BytesIO()
    codec.decompress_stream(llm.engine, io.BytesIO(base64.b64decode(z["data"])), back, "z4")
    assert back.getvalue() == text.encode() and "data" not in recs['"z5"']["result"]
    assert summary["compress"]["compressed_bytes"] == sum(recs[f'"z{i}"']["result"]["compressed_bytes"] for i in range(6))
    # the corpus total is the sum of the items' integers
    ppl = [r["result"] for r in recs.values() if r["task"] == "perplexity" and r["error"] is None]
    assert summary["perplexity"]["nll_q"] == sum(r["nll_q"] for r in ppl)
    assert summary["perplexity"]["tokens"] == sum(r["tokens"] for r in ppl)


def test_bad_items_are_per_item_errors(serial):
    _, data, summary = serial
    recs = records(data)
    assert len(recs) == N_GOOD + 14 and summary["items"] == N_GOOD + 14 and summary["errors"] == 14
    assert all(r["error"] is None for r in recs[:N_GOOD])
    errs = {json.dumps(r["id"]) if "line" not in r else f"line {r['line']}": r["error"] for r in recs[N_GOOD:]}
    base = N_GOOD + 1
    assert errs[f"line {base}"].startswith(f"line {base}: invalid JSON")
    assert errs[f"line {base + 1}"] == f"line {base + 1}: expected a JSON object, got list"
    assert errs[f"line {base + 2}"] == f"line {base + 2}: no 'id' field"
    assert errs[f"line {base + 3}"] == f"line {base + 3}: id: 1.5 must be a string or an integer"
    assert errs['"u1"'].startswith("task: 'translate' is not one of")
    assert errs['"u2"'].startswith("max_tokes: not a field of a generate item")
    assert errs['"u3"'] == "give exactly one of prompt, messages, ids"
    assert "do not fit the context length 256" in errs['"u4"']
    assert errs['"u5"'] == "ids: token id 999 is outside the vocabulary [0, 320)"
    assert errs['"u6"'].startswith("temperature:")
    assert "do not fit the context length 256 (give ctx" in errs['"u7"']
    assert errs['"u8"'] == "continuation: empty"
    assert errs[f"line {base + 12}"] == f'line {base + 12}: id "g0" is also the id of line 1'
    assert errs['"u9"'] == "ctx: 999 is more than the context length 256"
    assert all("\n" not in e and "Traceback" not in e for e in errs.values())


# ---------------------------------------------------------------- engines


@pytest.mark.parametrize("workers,batch_size", [(0, 1), (2, 5)])
def test_local_engine_same_bytes(serial, model_dir, items_file, tmp_path, workers, batch_size):
    out = str(tmp_path / "out.jsonl")
    summary = run_job(items_file, out, model=model_dir, workers=workers, batch_size=batch_size, threads=1)
    assert open(out, "rb").read() == serial[1] and summary == serial[2]


def test_unordered_same_records(serial, model_dir, items_file, tmp_path):
    out = str(tmp_path / "out.jsonl")
    run_job(items_file, out, model=model_dir, workers=2, batch_size=3, threads=1, unordered=True)
    assert by_id(open(out, "rb").read()) == by_id(serial[1])


def test_ray_data_same_bytes(serial, model_dir, items_file, tmp_path):
    from intdet.batch.ray_engine import _init_ray, shutdown_ray

    ray, started = _init_ray(None, 2)  # the engine's own local-mode settings, shared by both runs here
    assert started and ray.cluster_resources()["CPU"] == 2
    try:
        out = str(tmp_path / "ray.jsonl")
        summary = run_job(items_file, out, model=model_dir, engine="ray", workers=2, batch_size=6)
        assert by_id(open(out, "rb").read()) == by_id(serial[1]) and summary == serial[2]
        assert ray.is_initialized()  # run_job leaves a session it did not start

        # a user's own Dataset through BatchPredictor: the same records as intdet batch
        import ray.data

        # generate, score and perplexity rows of text: columns with gaps, as a user's table has
        rows = [json.loads(line) for i, line in enumerate(mixed_items()[:48]) if i % 8 in (0, 3, 5)]
        ds = ray.data.from_items(rows).map_batches(
            intdet.batch.BatchPredictor, fn_constructor_kwargs={"model": model_dir, "threads": 1},
            compute=ray.data.ActorPoolStrategy(size=2), num_cpus=1, batch_size=8)
        got = {r["id"]: r for r in ds.take_all()}
        want = {r["id"]: r for r in records(serial[1]) if "line" not in r}
        assert sorted(got) == sorted(r["id"] for r in rows)
        for k, r in got.items():
            assert json.loads(r["record"]) == want[k] and r["error"] == ""
    finally:
        shutdown_ray(ray)


def test_dask_same_bytes(serial, model_dir, items_file, tmp_path):
    out = str(tmp_path / "dask.jsonl")
    summary = run_job(items_file, out, model=model_dir, engine="dask", workers=2, batch_size=11)
    assert by_id(open(out, "rb").read()) == by_id(serial[1]) and summary == serial[2]


def test_dask_existing_cluster_by_address(serial, model_dir, tmp_path):
    from distributed import LocalCluster

    inp = tmp_path / "i.jsonl"
    inp.write_text("\n".join(mixed_items()[:30]) + "\n")
    out = str(tmp_path / "o.jsonl")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as cluster:
        run_job(str(inp), out, model=model_dir, engine="dask", workers=1, address=cluster.scheduler_address,
                batch_size=4)
    assert open(out, "rb").read().splitlines() == serial[1].splitlines()[:30]


# ---------------------------------------------------------------- resume


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "intdet", "batch", *args], capture_output=True, text=True,
                          env=env, start_new_session=True)


def test_killed_and_resumed_job_writes_the_same_file(serial, model_dir, items_file, tmp_path):
    out = str(tmp_path / "out.jsonl")
    env = dict(os.environ, INTDET_TEST_SIGNAL_AT="batch-record-37:SIGKILL")
    p = subprocess.Popen([sys.executable, "-m", "intdet", "batch", items_file, "-o", out, "-m", model_dir, "--workers",
                          "1", "--threads", "1", "--batch-size", "4"], env=env, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=open(tmp_path / "err", "wb"))  # no pipe the orphan holds
    p.wait(timeout=120)
    for _ in range(50):  # the driver died by SIGKILL: its orphaned worker notices and exits
        try:
            os.killpg(p.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(p.pid, signal.SIGKILL)
        pytest.fail("a worker process outlived its killed driver by 10 s")
    assert p.returncode == -signal.SIGKILL, (tmp_path / "err").read_text()
    first = open(out, "rb").read()
    assert first.count(b"\n") == 37 and serial[1].startswith(first)
    with open(out, "ab") as f:  # a crash in the middle of a write: an incomplete last line
        f.write(serial[1][len(first):len(first) + 25])
    r = _cli(items_file, "-o", out, "-m", model_dir, "--workers", "2", "--threads", "1", "--batch-size", "9")
    assert r.returncode == 0, r.stderr
    assert open(out, "rb").read() == serial[1]
    assert json.loads(r.stdout) == serial[2]
    # once more: everything is done, nothing is added
    r = _cli(items_file, "-o", out, "-m", model_dir, "--workers", "0")
    assert r.returncode == 0 and open(out, "rb").read() == serial[1]


def test_open_output_refuses_a_foreign_file(tmp_path):
    p = tmp_path / "o.jsonl"
    rec = b'{"error":"x","id":"a","result":null,"task":"score"}\n'
    for bad in (b"not a record\n", b'{"id": "b"}\n', b"[]\n"):
        p.write_bytes(rec + bad)
        with pytest.raises(IntdetError, match=r"o.jsonl: line 2 is not an intdet batch record"):
            open_output(str(p))
    p.write_bytes(rec + b'{"id": "b", "err')
    f, done = open_output(str(p))
    f.close()
    assert done == {'id:"a"': None} and p.read_bytes() == rec
    assert summarize(str(p))["items"] == 1


def test_open_output_is_locked(tmp_path):
    """A second job on the same output is refused while the first holds it
    (two appending jobs wrote every record twice)."""
    p = str(tmp_path / "o.jsonl")
    f, _ = open_output(p)
    try:
        with pytest.raises(IntdetError, match=r"-o .*o.jsonl: another intdet batch is writing it"):
            open_output(p)
    finally:
        f.close()
    g, done = open_output(p)  # free again once the first job's file is closed
    g.close()
    assert done == {}


def test_bom_and_ids_field_named(model_dir, tmp_path):
    """A UTF-8 byte-order mark before the first line is skipped; an error in
    an item's ``ids`` names ``ids`` (it said ``prompt``)."""
    inp = tmp_path / "i.jsonl"
    inp.write_bytes(b'\xef\xbb\xbf{"id": 1, "prompt": "hi", "max_tokens": 2}\n{"id": 2, "ids": [1, 99999999]}\n')
    out = tmp_path / "o.jsonl"
    r = _cli(str(inp), "-o", str(out), "-m", model_dir, "--workers", "0")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert recs[0]["error"] is None and recs[0]["result"]["finish_reason"] == "length"
    assert recs[1]["error"].startswith("ids: token id 99999999 is outside the vocabulary"), recs[1]


# ---------------------------------------------------------------- command line


def test_cli_errors_are_one_line(model_dir, items_file, tmp_path):
    out = str(tmp_path / "o.jsonl")
    for args, msg in [((str(tmp_path / "none.jsonl"), "-o", out), "none.jsonl: no such file"),
                      ((items_file, "-o", out, "--workers", "-1"), "--workers: -1 must be >= 0"),
                      ((items_file, "-o", out, "--engine", "ray", "--workers", "0"), "--workers: 0 must be >= 1"),
                      ((items_file, "-o", out, "--batch-size", "0"), "--batch-size: 0 must be >= 1"),
                      ((items_file, "-o", out, "--address", "x"), "--address: only for --engine ray or dask"),
                      ((items_file, "-o", items_file), "is the input file"),
                      ((items_file, "-o", str(tmp_path / "no" / "o.jsonl")), "does not exist"),
                      (("-", "-o", out), "IN.jsonl: '-' (stdin) is not supported"),
                      ((items_file, "-o", "-"), "-o -: stdout is not supported")]:
        r = _cli(*args, "-m", model_dir)
        assert r.returncode == 1 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    assert not os.path.exists(out)


def test_run_job_errors_name_the_argument(items_file, tmp_path, monkeypatch):
    """run_job (the Python side) names its arguments, not the CLI's options;
    a device that cannot run here is refused before any worker starts."""
    from intdet.batch import run_job
    from intdet.errors import IntdetError

    out = str(tmp_path / "o.jsonl")
    monkeypatch.setitem(sys.modules, "intdet.webgpu.backend", None)  # as if it were not there
    for kw, field, msg in ((dict(workers=-1), "workers", "workers: -1 must be >= 0"),
                           (dict(engine="bogus"), "engine", "engine: 'bogus': choose "),
                           (dict(batch_size=0), "batch_size", "batch_size: 0 must be >= 1"),
                           (dict(address="x"), "address", "address: only with the ray or dask engine"),
                           (dict(output_path=items_file), "output_path", f"output_path {items_file}: is the input"),
                           (dict(device="webgpu"), "device", "device webgpu: no WebGPU adapter available ("),
                           (dict(device="tpu", engine="ray"), "device", "device 'tpu' is not available")):
        with pytest.raises(IntdetError) as e:
            run_job(items_file, **{"output_path": out, **kw})
        assert e.value.field == field and str(e.value).startswith(msg), (str(e.value), e.value.field)
    assert not os.path.exists(out)


def test_cli_task_option_and_summary(model_dir, tmp_path):
    inp = tmp_path / "i.jsonl"
    inp.write_text('{"id": "a", "text": "the cat sat on the mat"}\n{"id": "b", "text": "a mat"}\n')
    out = str(tmp_path / "o.jsonl")
    r = _cli(str(inp), "-o", out, "-m", model_dir, "--task", "perplexity", "--workers", "0")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    recs = records(open(out, "rb").read())
    assert [x["task"] for x in recs] == ["perplexity"] * 2 and s["errors"] == 0
    assert s["perplexity"]["nll_q"] == sum(x["result"]["nll_q"] for x in recs)
    assert s["perplexity"]["nll"] == s["perplexity"]["nll_q"] / 2**24 / s["perplexity"]["tokens"]
    r = _cli(str(inp), "-o", str(tmp_path / "c.jsonl"), "-m", model_dir, "--task", "compress", "--workers", "0")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["errors"] == 0 and s["compress"]["bytes"] == 27 and s["compress"]["compressed_bytes"] > 0


def test_missing_extra_is_a_one_line_error(model_dir, items_file, tmp_path):
    blocked = tmp_path / "blocked"
    for name in ("ray", "distributed"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = dict(os.environ, PYTHONPATH=str(blocked))
    for engine, extra in (("ray", "ray"), ("dask", "dask")):
        out = tmp_path / f"{engine}.jsonl"
        r = _cli(items_file, "-o", str(out), "-m", model_dir, "--engine", engine, env=env)
        assert r.returncode == 1 and r.stderr.strip() == (
            f"intdet: error: --engine {engine} needs the {extra} extra: pip install 'intdet[{extra}]'"), r.stderr
        assert not out.exists()


def test_ctrl_c_stops_with_one_line_and_resumes(serial, model_dir, items_file, tmp_path):
    out = str(tmp_path / "out.jsonl")
    env = dict(os.environ, INTDET_TEST_SIGNAL_AT="batch-record-20:SIGINT")
    args = (items_file, "-o", out, "-m", model_dir, "--workers", "2", "--threads", "1", "--batch-size", "4")
    r = _cli(*args, env=env)
    assert r.returncode == 130 and r.stderr.strip() == "intdet: interrupted", r.stderr
    first = open(out, "rb").read()
    assert first.count(b"\n") == 20 and serial[1].startswith(first)
    r = _cli(*args)
    assert r.returncode == 0 and open(out, "rb").read() == serial[1]


def test_ctrl_c_stops_a_worker_busy_with_a_batch(serial, model_dir, items_file, tmp_path):
    """Ctrl-C while a worker is inside a batch (stalled there by the test
    hook): the job exits at once with the records written so far, and the
    rerun resumes. (The pool's shutdown(wait=False) used to leave the exit
    joining that worker: a hang.)"""
    out = str(tmp_path / "out.jsonl")
    env = dict(os.environ, INTDET_TEST_SIGNAL_AT="batch-record-4:SIGINT", INTDET_TEST_STALL_AT="batch-worker-2")
    args = (items_file, "-o", out, "-m", model_dir, "--workers", "1", "--threads", "1", "--batch-size", "4")
    r = subprocess.run([sys.executable, "-m", "intdet", "batch", *args], capture_output=True, text=True, env=env,
                       start_new_session=True, timeout=120)
    assert r.returncode == 130 and r.stderr.strip() == "intdet: interrupted", r.stderr
    first = open(out, "rb").read()
    assert first.count(b"\n") == 4 and serial[1].startswith(first)
    assert _cli(*args).returncode == 0 and open(out, "rb").read() == serial[1]


def test_a_failed_start_leaves_no_output(model_dir, tmp_path):
    """A job stopped before its first record (no such model, an unreachable
    --address) leaves no empty output file behind (it was created first)."""
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id": 1, "prompt": "x", "max_tokens": 1}\n')
    out = tmp_path / "out.jsonl"
    r = _cli(str(inp), "-o", str(out), "-m", str(tmp_path / "nope"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "nope" in r.stderr, r.stderr
    assert not out.exists()
    if importlib.util.find_spec("distributed") is not None:
        r = _cli(str(inp), "-o", str(out), "-m", model_dir, "--engine", "dask", "--address", "bogus://x")
        assert r.returncode == 1 and r.stderr.startswith(
            "intdet: error: --address bogus://x: cannot reach a Dask scheduler there"), r.stderr
        assert not out.exists()


def test_score_errors_name_their_field(model_dir, tmp_path):
    """A score item's bad ids name context or continuation (not prompt);
    top has LLM.score's limit."""
    lines = ['{"id": 1, "task": "score", "context": [999999], "continuation": "a"}',
             '{"id": 2, "task": "score", "context": "a", "continuation": [5, 999999]}',
             '{"id": 3, "task": "score", "context": "a", "continuation": []}',
             '{"id": 4, "task": "score", "context": "a", "continuation": "b", "top": 50}']
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    r = _cli(str(inp), "-o", str(out), "-m", model_dir, "--workers", "0")
    assert r.returncode == 0, r.stderr  # error records are results
    errs = {rec["id"]: rec["error"] for rec in records(out.read_bytes())}
    assert errs[1].startswith("context: token id 999999 is outside the vocabulary"), errs
    assert errs[2].startswith("continuation: token id 999999 is outside the vocabulary"), errs
    assert errs[3] == "continuation: empty", errs
    assert errs[4] == "top: 50 must be an integer in [0, 20]", errs  # was [0, 1000] here, [0, 20] in the worker


def test_resume_refuses_the_output_of_another_input(model_dir, tmp_path):
    """OUT holding records of ids the input lacks is another input's output:
    refused before anything runs or is appended (resuming would count them)."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"id": "q1", "prompt": "hello", "max_tokens": 2}) + "\n")
    old = json.dumps({"id": "other", "task": "generate", "result": None, "error": "x"}, sort_keys=True) + "\n"
    out.write_text(old)
    r = _cli(str(inp), "-o", str(out), "-m", model_dir)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "holds 1 record(s) whose ids are not in" in r.stderr and 'id:"other"' in r.stderr, r.stderr
    assert out.read_text() == old


def test_resume_refuses_a_record_of_a_changed_line(model_dir, tmp_path):
    """A record carries its item's digest (item_sha256): an input line that
    changed under the same id since its record was written is refused on
    resume, before anything runs or is appended; the unchanged input resumes
    (nothing left to do) and a record without a digest (older files) is
    taken as it is."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    line = {"id": "q1", "prompt": "hello", "max_tokens": 2}
    inp.write_text(json.dumps(line) + "\n")
    r = _cli(str(inp), "-o", str(out), "-m", model_dir, "--workers", "0")
    assert r.returncode == 0, r.stderr
    rec = json.loads(out.read_text())
    assert len(rec["item_sha256"]) == 16 and rec["error"] is None
    first = out.read_text()
    assert _cli(str(inp), "-o", str(out), "-m", model_dir, "--workers", "0").returncode == 0
    assert out.read_text() == first
    inp.write_text(json.dumps(dict(line, prompt="goodbye")) + "\n")
    r = _cli(str(inp), "-o", str(out), "-m", model_dir, "--workers", "0")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert 'the record of id:"q1" was made from a different item than line 1' in r.stderr, r.stderr
    assert out.read_text() == first
    del rec["item_sha256"]  # a record from before digests: resumed as done
    out.write_text(json.dumps(rec, sort_keys=True) + "\n")
    r = _cli(str(inp), "-o", str(out), "-m", model_dir, "--workers", "0")
    assert r.returncode == 0 and out.read_text().count("\n") == 1, r.stderr


def fewshot_items():
    """Generate and structured-output items sharing a long prompt start
    (a few-shot header), as an evaluation job's."""
    header = " ".join(["the cat sat on the mat and then ran off"] * 6)
    out = []
    for i in range(12):
        d = {"id": f"f{i}", "prompt": f"{header} question {i}: who sat?", "max_tokens": 4}
        if i % 3 == 1:
            d.update(temperature=0.9, seed=i)
        out.append(json.dumps(d))
    return out


def test_prefix_cache_same_bytes_and_hits(model_dir, tmp_path):
    """--prefix-cache in a batch job: the same file, byte for byte, and the
    worker's scheduler really reused the shared header's KV cache."""
    from intdet.batch.tasks import TaskRunner

    inp = tmp_path / "few.jsonl"
    inp.write_text("\n".join(fewshot_items()) + "\n")
    outs = []
    for cache in (False, True):
        out = str(tmp_path / f"out{cache}.jsonl")
        run_job(str(inp), out, model=model_dir, workers=0, batch_size=4, threads=1, prefix_cache=cache)
        outs.append(open(out, "rb").read())
    assert outs[0] == outs[1] and len(outs[0].splitlines()) == 12
    runner = TaskRunner(model_dir, threads=1, prefix_cache=True)
    from intdet.batch.items import parse_line

    seen: dict = {}
    items = [parse_line(i, s, "generate", seen) for i, s in enumerate(fewshot_items())]
    recs = runner.run(items[:4]) + runner.run(items[4:])
    assert [json.dumps(r, sort_keys=True) for r in recs] == [json.dumps(json.loads(b), sort_keys=True)
                                                             for b in outs[0].splitlines()]
    cache = runner.llm.scheduler.cache
    assert cache.hits >= 10 and cache.hit_tokens >= 10 * 40


def test_structured_output_items(model_dir, tmp_path):
    """A generate item's structured_outputs: the text matches its regex or
    choice; a bad one is that item's error naming the field."""
    pytest.importorskip("llguidance")
    inp = tmp_path / "so.jsonl"
    rows = [{"id": "c", "prompt": "the cat", "max_tokens": 8, "structured_outputs": {"choice": ["mat", "hat"]}},
            {"id": "r", "prompt": "the cat", "max_tokens": 6, "structured_outputs": {"regex": "[0-9]{3}"}},
            {"id": "bad", "prompt": "the cat", "max_tokens": 6, "structured_outputs": {"regex": "("}}]
    inp.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = str(tmp_path / "so_out.jsonl")
    run_job(str(inp), out, model=model_dir, workers=0, batch_size=3, threads=1)
    recs = {r["id"]: r for r in records(open(out, "rb").read())}
    assert recs["c"]["result"]["text"] in ("mat", "hat")
    assert len(recs["r"]["result"]["text"]) == 3 and recs["r"]["result"]["text"].isdigit()
    assert "structured_outputs" in recs["bad"]["error"] and "\n" not in recs["bad"]["error"]
