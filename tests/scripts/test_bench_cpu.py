"""scripts/bench_cpu.py without llama.cpp: its table format, the intdet
worker, and the peak-RSS code the llama.cpp worker loads in a venv that has
no intdet."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import intdet.rss
from intdet.convert import convert

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "bench_cpu.py")


@pytest.fixture(scope="module")
def bench_cpu():
    spec = importlib.util.spec_from_file_location("bench_cpu", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_format_result_is_unchanged(bench_cpu):
    def eng(p, d, mib):
        return {"prefill_tok_s": p, "decode_tok_s": d, "peak_rss_bytes": mib * 2**20}

    res = {"model": "M", "note": "intdet: int8; llama.cpp: Q8_0", "prompt_tokens": 512, "gen_tokens": 128, "repeats": 3,
           "intdet_isa": "avx2", "llama_cpp_version": "0.3.16",
           "rows": [{"threads": 1, "intdet": eng(812.25, 41.5, 300), "llama": eng(400.0, 50.125, 250.4),
                     "greedy_tokens_agree": 17},
                    {"threads": 16, "intdet": eng(9812.25, 141.5, 1300), "llama": eng(0, 150.0, 1250),
                     "greedy_tokens_agree": 128}]}
    assert bench_cpu.format_result(res) == """\
M: intdet: int8; llama.cpp: Q8_0
prompt 512 tok, decode 128 tok (batch 1, greedy), median of 3; intdet isa avx2, llama-cpp-python 0.3.16
threads  metric        intdet  llama.cpp  intdet/llama.cpp
      1  pp512 tok/s    812.2      400.0              2.03
      1  tg128 tok/s     41.5       50.1              0.83
      1  peak RSS MiB     300        250              1.20
     16  pp512 tok/s   9812.2        0.0                 -
     16  tg128 tok/s    141.5      150.0              0.94
     16  peak RSS MiB    1300       1250              1.04
greedy decode tokens equal between the engines from the start: threads 1: 17/128, threads 16: 128/128"""


def test_llama_worker_reads_peak_rss_without_intdet(tmp_path):
    """The llama.cpp worker's python has no intdet: it loads intdet/rss.py by
    path. `python -I -S` stands in for it (no site-packages at all)."""
    code = ("import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('bench_cpu', sys.argv[1])\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "print(m._peak_rss_bytes({'rss_py': sys.argv[2]}), any('intdet' in k for k in sys.modules))\n"
            "import intdet\n")
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code, SCRIPT, intdet.rss.__file__], capture_output=True,
                       text=True, cwd=tmp_path)
    assert "No module named 'intdet'" in r.stderr, r.stderr  # the last line: intdet really is absent
    rss, imported = r.stdout.split()
    assert int(rss) > 1 << 20 and imported == "False"


def test_intdet_worker(tmp_path, tiny_llama_hf):
    from intdet.bench import run_bench
    from intdet.model import load_model

    model = convert(tiny_llama_hf, str(tmp_path / "m"), progress=False)
    ids = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"model": model, "ids": ids, "gen": 4, "threads": 1}))
    r = subprocess.run([sys.executable, SCRIPT, "--worker", "intdet", str(spec)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("BENCH_RESULT ")]
    res = json.loads(line[len("BENCH_RESULT "):])
    assert set(res) == {"prefill_tok_s", "decode_tok_s", "threads", "tokens", "peak_rss_bytes", "isa"}
    assert res["threads"] == 1 and res["peak_rss_bytes"] > 1 << 20
    (row,) = run_bench(load_model(model), gen_tokens=4, threads=[1], prompt_ids=ids, keep_tokens=True)
    assert res["tokens"] == row["decode_tokens"] and res["isa"] == row["isa"]


def test_format_result_with_llama_bench(bench_cpu):
    """llama-bench and llama-cpp-python side by side: ratios against each, then every engine's thread scaling."""
    def eng(p, d, mib):
        return {"prefill_tok_s": p, "decode_tok_s": d, "peak_rss_bytes": mib * 2**20}

    res = {"model": "M", "note": "n", "prompt_tokens": 512, "gen_tokens": 128, "repeats": 3, "intdet_isa": "avx2",
           "peers": ["llama_bench", "llama"], "llama_bench_version": "abc (build 1)", "llama_version": "0.3.36",
           "rows": [{"threads": 1, "intdet": eng(200.0, 50.0, 230), "llama_bench": eng(250.0, 40.0, 200),
                     "llama": eng(100.0, 25.0, 240), "greedy_tokens_agree": 128, "intdet_tokens_same_every_run": True},
                    {"threads": 2, "intdet": eng(380.0, 90.0, 230), "llama_bench": eng(500.0, 80.0, 200),
                     "llama": eng(150.0, 40.0, 240), "greedy_tokens_agree": 128, "intdet_tokens_same_every_run": True}]}
    assert bench_cpu.format_result(res) == """\
M: n
prompt 512 tok, decode 128 tok (batch 1, greedy), median of 3; intdet kernel sets avx2; llama-bench abc (build 1), \
llama-cpp-python 0.3.36
threads  metric        intdet  llama-bench  llama-cpp-python  intdet/llama-bench  intdet/llama-cpp-python
      1  pp512 tok/s    200.0        250.0             100.0                0.80                     2.00
      1  tg128 tok/s     50.0         40.0              25.0                1.25                     2.00
      1  peak RSS MiB     230          200               240                1.15                     0.96
      2  pp512 tok/s    380.0        500.0             150.0                0.76                     2.53
      2  tg128 tok/s     90.0         80.0              40.0                1.12                     2.25
      2  peak RSS MiB     230          200               240                1.15                     0.96
scaling: pp512 1->2 threads: 1.90x intdet, 2.00x llama-bench, 1.50x llama-cpp-python; \
tg128 1->2 threads: 1.80x intdet, 2.00x llama-bench, 1.60x llama-cpp-python
greedy decode tokens equal between intdet and llama-cpp-python from the start: threads 1: 128/128, threads 2: 128/128
intdet greedy tokens identical in every run and kernel set: yes"""


def test_format_result_scaling_of_every_kernel_set(bench_cpu):
    """--isa avx2 --isa avx512 at 1 and 2 threads: the scaling line gives each set's own (it gave the first's)."""
    def eng(p, d):
        return {"prefill_tok_s": p, "decode_tok_s": d, "peak_rss_bytes": 200 * 2**20}

    res = {"model": "M", "note": "n", "prompt_tokens": 512, "gen_tokens": 128, "repeats": 5, "intdet_isa": "avx2",
           "peers": ["llama_bench"], "llama_bench_version": "abc (build 1)",
           "rows": [{"threads": 1, "intdet": eng(300.0, 60.0), "llama_bench": eng(300.0, 50.0),
                     "intdet_by_isa": {"avx2": eng(300.0, 60.0), "avx512": eng(450.0, 80.0)},
                     "intdet_tokens_same_every_run": True},
                    {"threads": 2, "intdet": eng(450.0, 90.0), "llama_bench": eng(480.0, 70.0),
                     "intdet_by_isa": {"avx2": eng(450.0, 90.0), "avx512": eng(855.0, 112.0)},
                     "intdet_tokens_same_every_run": True}]}
    (line,) = [ln for ln in bench_cpu.format_result(res).splitlines() if ln.startswith("scaling: ")]
    assert line == ("scaling: pp512 1->2 threads: 1.50x intdet avx2, 1.90x intdet avx512, 1.60x llama-bench; "
                    "tg128 1->2 threads: 1.50x intdet avx2, 1.40x intdet avx512, 1.40x llama-bench")


def test_llama_bench_worker_compares_decode_at_the_prompt_depth(tmp_path, bench_cpu):
    """The worker runs llama-bench with -d 0,P: its decode at depth P (what
    intdet's decode after a P-token prompt does) is the figure compared, its
    depth-0 decode is kept beside it, and a run without a test it needs is a
    one-line error."""
    fake = tmp_path / "llama-bench"
    args_file = tmp_path / "args.txt"
    tests = [{"n_prompt": 6, "n_gen": 0, "n_depth": 0, "avg_ts": 300.0},
             {"n_prompt": 0, "n_gen": 4, "n_depth": 0, "avg_ts": 90.0},
             {"n_prompt": 6, "n_gen": 0, "n_depth": 6, "avg_ts": 280.0},
             {"n_prompt": 0, "n_gen": 4, "n_depth": 6, "avg_ts": 70.0}]
    for t in tests:
        t.update(build_commit="abc", build_number=7, cpu_info="CPU")
    fake.write_text(f"#!{sys.executable}\nimport sys, json\nopen({str(args_file)!r}, 'w').write(' '.join(sys.argv[1:]))\n"
                    f"print(json.dumps({json.dumps(tests)}))\n")
    fake.chmod(0o755)
    spec = {"llama_bench": str(fake), "model": "m.gguf", "ids": [1, 2, 3, 4, 5, 6], "gen": 4, "threads": 2}
    res = bench_cpu.worker_llama_bench(spec)
    assert "-p 6 -n 4 -d 0,6 -t 2 -fa 1" in args_file.read_text()
    assert (res["prefill_tok_s"], res["decode_tok_s"], res["decode_d0_tok_s"]) == (300.0, 70.0, 90.0)
    assert res["version"] == "abc (build 7)"
    fake.write_text(f"#!{sys.executable}\nimport json\nprint(json.dumps({json.dumps(tests[:2])}))\n")
    with pytest.raises(SystemExit, match="n_depth 6"):
        bench_cpu.worker_llama_bench(spec)


def test_format_result_names_llama_bench_decode_from_empty_context(bench_cpu):
    def eng(p, d, mib, d0=None):
        r = {"prefill_tok_s": p, "decode_tok_s": d, "peak_rss_bytes": mib * 2**20}
        return r if d0 is None else {**r, "decode_d0_tok_s": d0}

    res = {"model": "M", "note": "n", "prompt_tokens": 512, "gen_tokens": 128, "repeats": 1, "intdet_isa": "avx2",
           "peers": ["llama_bench"], "llama_bench_version": "abc (build 1)",
           "rows": [{"threads": 2, "intdet": eng(380.0, 90.0, 230), "llama_bench": eng(500.0, 80.0, 200, d0=101.5),
                     "intdet_tokens_same_every_run": True}]}
    out = bench_cpu.format_result(res)
    assert ("tg128 is decode continuing the 512-token prompt for every engine (llama-bench -d 512); "
            "llama-bench's tg128 from an empty context (-d 0): threads 2: 101.5 tok/s") in out
    assert "      2  tg128 tok/s     90.0         80.0                1.12" in out


def test_moe_over_dense_ratios(bench_cpu):
    def row(p, d):
        return {"threads": 2, "intdet": {"prefill_tok_s": p, "decode_tok_s": d},
                "llama_bench": {"prefill_tok_s": p / 2, "decode_tok_s": d / 4}}

    moe = {"model": "qwen3-moe-8x768-top2 (random weights)", "peers": ["llama_bench"], "rows": [row(300.0, 90.0)]}
    dense = {"model": "qwen3-dense-6144 (random weights)", "peers": ["llama_bench"], "rows": [row(200.0, 30.0)]}
    out = bench_cpu.format_moe_vs_dense([moe, dense]).splitlines()
    assert out[2].split() == ["2", "intdet", "1.50", "3.00"]
    assert out[3].split() == ["2", "llama_bench", "1.50", "3.00"]
    assert "missing" in bench_cpu.format_moe_vs_dense([moe])
