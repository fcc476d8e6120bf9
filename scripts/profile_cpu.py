#!/usr/bin/env python3
"""Wall time per op and per layer of intdet's CPU forward, for one or more
thread counts side by side, so a thread-scaling regression names its op.

    python scripts/profile_cpu.py [MODEL] [--threads 1 --threads 2] [--prompt-tokens 512]
                                  [--gen-tokens 128] [--isa avx2] [--per-layer] [--repeats 3]
                                  [--batch-rows 8]

MODEL: an intdet model directory or a GGUF / HF checkpoint (converted and
cached as `intdet` does); default SmolLM2-135M-Instruct.

For each thread count (alternating between them ``--repeats`` times, medians
shown): prompt processing (one forward of ``--prompt-tokens`` ids) and decode
(``--gen-tokens`` greedy steps at batch 1, the Python step loop of
``intdet bench``; with ``--batch-rows R``, R sequences after the same
prompt advanced as the rows of one ``forward_batch`` per step, as the
server's scheduler and ``intdet decompress`` run them), with the C++ op profile on (``_core.set_op_profile``,
csrc/include/intdet/trace.h). An op's time runs from the end of the previous
op to its own end on the calling thread, so it includes the op's OpenMP fork,
its load imbalance and its closing barrier. The ops:

  embed        token embedding rows -> residual
  attn_norm    RMSNorm + int16 quantization of its output (one row pass)
  attn_qkv     the Q, K, V linear layers (one parallel region)
  qk_norm      per-head q/k RMSNorm (Qwen3, Gemma 3)
  rope_kv      RoPE and the int8 KV cache append
  attention    the per-(row, head) attention loop
  attn_output  int16 quantization of the heads' output, the output linear, residual add (or Gemma's post-norm)
  ffn_norm     RMSNorm + int16 quantization
  ffn_gate_up  gate and up linears with SwiGLU / GeGLU on each thread's channels
  ffn_down     int16 quantization, the down linear, residual add (or post-norm)
  output       final RMSNorm, lm_head, the int32 logits copy

and, outside the C++ forward, for decode: ``python step`` (per step wall time
of ``State.forward`` minus the forward itself: pybind, numpy, the KV
bookkeeping) and ``sampler`` (``Sampler.pick``). Columns: ms per forward
(prompt) or per step (decode) at each thread count, share of the total, and
the speed-up from the first thread count to each other one (an op stuck near
1.0x is serial or barrier-bound; the total's speed-up is the scaling).
Timings are wall clock: on a shared machine they are noisy; alternate and
take medians (``--repeats``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def profile_once(engine, core, ids: list, gen: int, threads: int, rows: int = 1) -> dict:
    """One prompt forward and ``gen`` decode steps at ``threads`` threads;
    returns {"prompt": {(layer, op): ns}, "decode": {(layer, op): ns per step}}.
    ``rows`` > 1: the decode steps advance that many sequences (each after
    its own prefill of ``ids``; only the first prefill is profiled) as the
    rows of one ``Engine.forward_batch``, as the server's scheduler and
    decompression run them."""
    import numpy as np

    from intdet.sampling import Sampler

    core.set_num_threads(threads)
    sampler = Sampler()
    seqs = [engine.new_state(len(ids) + gen + 1) for _ in range(rows)]
    core.set_op_profile(True)
    logits = seqs[0].forward(ids)[-1]
    prompt = {(layer, op): ns for op, layer, _calls, ns in core.op_profile()}
    core.set_op_profile(False)
    for s in seqs[1:]:
        s.forward(ids)
    toks = [sampler.pick(logits, seqs[0].n_past)] * rows
    buf = np.empty((rows, engine.vocab_size), dtype=np.int32)
    core.set_op_profile(True)  # clears
    step_ns = sample_ns = 0
    for _ in range(gen):
        t0 = time.perf_counter_ns()
        if rows == 1:
            out = [seqs[0].forward(toks)[-1]]
        else:
            out = engine.forward_batch(seqs, [np.array([t], np.int32) for t in toks], out=buf)
        t1 = time.perf_counter_ns()
        toks = [sampler.pick(lg.reshape(-1, lg.shape[-1])[-1], s.n_past) for lg, s in zip(out, seqs)]
        t2 = time.perf_counter_ns()
        step_ns += t1 - t0
        sample_ns += t2 - t1
    decode = {(layer, op): ns / gen for op, layer, _calls, ns in core.op_profile()}
    core.set_op_profile(False)
    decode[(-1, "python step")] = step_ns / gen - decode[(-1, "forward")]
    decode[(-1, "sampler")] = sample_ns / gen
    decode[(-1, "step total")] = (step_ns + sample_ns) / gen
    return {"prompt": prompt, "decode": decode}


def table(phase: str, runs: dict, threads: list, per_layer: bool, unit: str) -> str:
    """runs: threads -> list of {(layer, op): ns}; medians over the list."""
    from intdet.bench import text_table

    keys = list(runs[threads[0]][0])
    med = {t: {k: statistics.median(r.get(k, 0) for r in runs[t]) for k in keys} for t in threads}
    total_key = (-1, "step total") if phase == "decode" else (-1, "forward")
    if per_layer:
        rows = [k for k in keys if k[1] not in ("forward", "step total")]
    else:  # ops summed over the layers
        rows, seen = [], set()
        for layer, op in keys:
            if op in ("forward", "step total") or op in seen:
                continue
            seen.add(op)
            rows.append(("all" if layer >= 0 else -1, op))
        for t in threads:
            for layer, op in keys:
                if layer >= 0:
                    med[t][("all", op)] = med[t].get(("all", op), 0) + med[t][(layer, op)]
    head = ["layer", "op"] + [f"{t}t {unit}" for t in threads] + [f"{t}t %" for t in threads]
    head += [f"{threads[0]}t/{t}t" for t in threads[1:]]
    lines = []
    for k in rows + [total_key]:
        vals = [med[t][k] / 1e6 for t in threads]
        shares = [f"{100 * med[t][k] / med[t][total_key]:.1f}" for t in threads]
        ups = [f"{vals[0] / v:.2f}x" if v > 0 else "-" for v in vals[1:]]
        layer = "" if k[0] == -1 else str(k[0])
        lines.append([layer, k[1]] + [f"{v:.3f}" for v in vals] + shares + ups)
    return text_table(head, lines, left=(0, 1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None, help="model (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--threads", type=int, action="append", help="thread count (repeatable; default 1 and 2)")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds per thread count (median; default 3)")
    ap.add_argument("--isa", default=None, help="kernel set (default: the best this CPU runs)")
    ap.add_argument("--per-layer", action="store_true", help="one row per op and layer (default: ops summed over layers)")
    ap.add_argument("--batch-rows", type=int, default=1,
                    help="decode this many sequences as the rows of one forward_batch step (default 1)")
    args = ap.parse_args(argv)
    threads = args.threads or [1, 2]
    if min(threads) < 1 or args.repeats < 1 or args.gen_tokens < 1 or args.batch_rows < 1:
        ap.error("--threads, --repeats, --gen-tokens and --batch-rows must be >= 1")

    from intdet import _core
    from intdet.bench import bench_prompt_ids
    from intdet.errors import IntdetError
    from intdet.model import Engine, load_model
    from intdet.resolve import converted_path, default_model_path

    try:
        if args.isa:
            if args.isa.lower() not in _core.available_isas():
                ap.error(f"--isa {args.isa}: not a kernel set this build and CPU run "
                         f"(choose {', '.join(_core.available_isas())})")
            _core.set_isa(args.isa.lower())
        src = args.model or default_model_path()
        lm = load_model(converted_path(src, progress=False))
        ids = bench_prompt_ids(lm, args.prompt_tokens)
        if len(ids) + args.gen_tokens + 1 > lm.cfg["context_length"]:
            raise IntdetError(f"--prompt-tokens + --gen-tokens exceed the context length {lm.cfg['context_length']}")
    except (IntdetError, OSError) as e:  # OSError: a model path that is not there
        print(f"error: {e}", file=sys.stderr)
        return 2
    engine = Engine(lm, "cpu")
    core = _core  # the cpu backend is intdet._core; its op profile is read here
    core.set_num_threads(threads[0])
    seq = engine.new_state(16)  # warm-up: page in the weights, start the threads
    seq.forward(ids[:8])
    seq.forward([ids[-1]])
    del seq
    runs = {t: [] for t in threads}
    for r in range(args.repeats):
        for t in threads:
            res = profile_once(engine, core, ids, args.gen_tokens, t, args.batch_rows)
            runs[t].append(res)
            pf = res["prompt"][(-1, "forward")] / 1e9
            st = res["decode"][(-1, "step total")] / 1e9
            print(f"round {r + 1}/{args.repeats} threads {t}: prompt {len(ids) / pf:.1f} tok/s, "
                  f"decode {args.batch_rows / st:.1f} tok/s",
                  file=sys.stderr, flush=True)
    print(f"{lm.path}: kernel set {core.isa()}, prompt {len(ids)} tokens, decode {args.gen_tokens} steps, "
          f"median of {args.repeats}; loadavg {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"\nprompt processing (ms per forward of {len(ids)} tokens)")
    print(table("prompt", {t: [x["prompt"] for x in runs[t]] for t in threads}, threads, args.per_layer, "ms"))
    print(f"\ndecode (ms per step, {args.batch_rows} row(s) a step)")
    print(table("decode", {t: [x["decode"] for x in runs[t]] for t in threads}, threads, args.per_layer, "ms"))
    for t in threads:
        pp = statistics.median(len(ids) / (x["prompt"][(-1, "forward")] / 1e9) for x in runs[t])
        tg = statistics.median(args.batch_rows * 1e9 / x["decode"][(-1, "step total")] for x in runs[t])
        rows = f" ({args.batch_rows} rows a step)" if args.batch_rows > 1 else ""
        print(f"threads {t}: prompt {pp:.1f} tok/s, decode {tg:.1f} tok/s{rows}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
