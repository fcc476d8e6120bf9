#!/usr/bin/env bash
# scripts/device-check.sh: the CUDA backend's check on a lent GPU machine
# (nvidia-h200: python3 3.12 with torch, transformers, pybind11,
# scikit-build-core, xxhash, click, safetensors, tokenizers; nvcc 13.0;
# cuobjdump; no network). One run, about 6-8 minutes:
#   1. build intdet in place with the CUDA module (pip install -e .)
#   2. scripts/check_sass.py on the built module (no float instruction)
#   3. python -m pytest tests/engine/test_cuda.py (GPU tests; the emulator ones too)
#   3b. scripts/bench_div.py: ns per division, udiv_u64 against DivBy (issue 50)
#   4. a deterministic random Qwen3-0.6B-shaped model (intdet random-model +
#      intdet convert), `intdet hash-check --device cuda --steps 16 --expect PIN`:
#      the CPU run must give the pinned hash (computed on x86 CPUs, docs/cuda.md)
#      and every GPU configuration the same bits
#   5. speed: decode tok/s at batch 1 and 8, prefill tok/s at 2048 tokens, next
#      to torch fp16 (Hugging Face, eager and, if it compiles in time,
#      torch.compile with CUDA graphs) on the same weights
#   6. compute-sanitizer memcheck on the op tests, if time is left
# Results: $OUT/device-results-<date>.md (and docs/ in this working copy),
# the full log in $OUT/device-check.log.
#
# Carried wheels (folder wheels/, git-ignored: name it in the device tool's
# `carry`): what intdet needs that the GPU image lacks (gguf, nlohmann-json;
# /work/.library/device/KINDS.md lists the image's packages). Fetch them here
# first with:  bash scripts/fetch-device-wheels.sh
#
# Usage (device tool, from the repo root):  bash scripts/device-check.sh
# Rehearsal on a machine without a GPU:     STANDIN=1 bash scripts/device-check.sh
#   (every step but the GPU ones: wheels, the CUDA build, the SASS check, the
#   random model, its pinned sha256 and the CPU hash against PIN)
# Environment: OUT (results folder; default build/device-out), PIN (expected greedy
# hash; default below), STEPS (default 16), SKIP_TORCH=1, SKIP_COMPILE=1, STANDIN=1,
# BUILD_LIMIT, HC_LIMIT (seconds for the build and hash-check steps; default 420
# each, enough on 16 cores; the rehearsal on 2 cores runs the whole CPU matrix).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

PIN=${PIN:-e3ef2d10076c}  # intdet hash-check -m <random qwen3-0.6b, seed 0> --steps 16, CPU, format_version 2 (docs/cuda.md)
MODEL_PIN=54c71e9d6fcc22a3  # sha256 prefix of that converted model.safetensors
STEPS=${STEPS:-16}
OUTDIR=${OUT:-$ROOT/build/device-out}  # build/ is git-ignored
mkdir -p "$OUTDIR"
LOG=$OUTDIR/device-check.log
DATE=$(date -u +%Y-%m-%d)
RES=$OUTDIR/device-results-$DATE.md
WORK=${WORK:-/tmp/intdet-device}
mkdir -p "$WORK"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
STANDIN=${STANDIN:-}
gpu() { [ -z "$STANDIN" ]; }  # the GPU steps run only on a real device
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
exec > >(tee -a "$LOG") 2>&1

FAILED=()
WARNED=()
START=$SECONDS
step() { echo; echo "=== [$((SECONDS - START))s] $*"; }
# run NAME TIMEOUT CMD...: runs a step; a failure is recorded, not fatal.
run() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS rc=0
  timeout --kill-after=10 "$limit" "$@" || rc=$?
  echo "--- $name: rc=$rc ($((SECONDS - t0)) s)"
  if [ "$rc" -ne 0 ]; then FAILED+=("$name (rc=$rc)"); fi
  return 0
}
# soft NAME TIMEOUT CMD...: like run, but a failure is only a warning (comparisons).
soft() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS rc=0
  timeout --kill-after=10 "$limit" "$@" || rc=$?
  echo "--- $name: rc=$rc ($((SECONDS - t0)) s)"
  if [ "$rc" -ne 0 ]; then WARNED+=("$name (rc=$rc)"); fi
  return 0
}

{
  echo "# intdet CUDA backend: device check, $DATE"
  echo
  echo "Written by scripts/device-check.sh on the lent GPU machine."
  echo
} >"$RES"
md() { echo "$*" >>"$RES"; }

step "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
$PY -V
command -v nvcc && nvcc --version | tail -2 || echo "no nvcc on PATH"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" || true
md "## Environment"
md '```'
md "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true)"
md "$($PY -V 2>&1); $( (nvcc --version | tail -1) 2>&1 || echo no nvcc)"
md "$($PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| transformers', transformers.__version__)" 2>&1 | tail -1)"
md '```'

step "carried wheels"
if compgen -G "wheels/*.whl" >/dev/null; then
  run wheels 120 $PY -m pip install -q --no-index --no-deps --find-links wheels/ wheels/*.whl
else
  echo "no wheels/ folder (bash scripts/fetch-device-wheels.sh makes it): gguf and nlohmann-json must already be installed"
fi
run deps 30 $PY -c "import gguf, nlohmann_json; print('gguf', gguf.__file__)"

step "build (pip install -e . with CUDA)"
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
run build "${BUILD_LIMIT:-420}" $PY -m pip install -q --no-build-isolation --no-index --no-deps -e . \
  -Ccmake.define.INTDET_CUDA=ON -Cbuild-dir=build/device
run import 60 $PY -c "import intdet._cuda as c, os; n = c.device_count(); print('devices', n, c.device_name() if n else c.no_device_reason()); assert n > 0 or os.environ.get('STANDIN')"
md
md "## Build and SASS check"
md '```'
md "$(grep -E -- '--- (build|import)' "$LOG" | tail -2)"
step "SASS check"
SASS_OUT=$WORK/sass.txt
run sass 300 bash -c "set -o pipefail; $PY scripts/check_sass.py --top 6 2>&1 | tee $SASS_OUT"
md "$(cat "$SASS_OUT" 2>/dev/null || echo 'check_sass did not run')"
md '```'

step "tests/engine/test_cuda.py"
TEST_OUT=$WORK/pytest.txt
gpu && run pytest 360 bash -c "set -o pipefail; $PY -m pytest -q -p no:cacheprovider tests/engine/test_cuda.py -k 'not emu and not test_engine_generate_hash_equal and not test_scheduler_device_lane and not first_divergence' 2>&1 | tee $TEST_OUT"
md
md "## tests/engine/test_cuda.py (GPU tests; the emulator ones are left to CPU machines)"
md '```'
md "$(tail -n 15 "$TEST_OUT" 2>/dev/null || echo 'pytest did not run')"
md '```'

step "division microbenchmark (scripts/bench_div.py)"
DIV_OUT=$WORK/bench-div.txt
DIV_EMU=""
gpu || DIV_EMU="--emu"  # stand-in: the host emulator (the checks, not the times)
soft div-bench 120 bash -c "set -o pipefail; $PY scripts/bench_div.py $DIV_EMU 2>&1 | tee $DIV_OUT"
md
md "## Division microbenchmark (udiv_u64 against DivBy; ns per int64 division${DIV_EMU:+, on the host emulator: the checks only, not GPU times})"
md '```'
md "$(cat "$DIV_OUT" 2>/dev/null || echo 'bench_div did not run')"
md '```'

step "random Qwen3-0.6B-shaped model"
HF=$WORK/qwen3-0.6b-hf
INT=$WORK/qwen3-0.6b
if [ ! -f "$INT/model.safetensors" ]; then
  run random-model 240 bash -c "$PY -m intdet random-model $HF --shape qwen3-0.6b --seed 0 > $WORK/random-model.log 2>&1"
  run convert 300 $PY -m intdet convert "$HF" -o "$INT" --force
fi
MODEL_SHA=$( (sha256sum "$INT/model.safetensors" | cut -c1-16) 2>/dev/null || echo missing)
echo "model.safetensors sha256 $MODEL_SHA (pinned $MODEL_PIN)"
[ "$MODEL_SHA" = "$MODEL_PIN" ] || FAILED+=("model sha256 $MODEL_SHA != $MODEL_PIN")
md
md "## hash-check, random Qwen3-0.6B shape (seed 0), $STEPS steps, --expect $PIN"
md
md "Converted model.safetensors sha256 $MODEL_SHA... (pinned $MODEL_PIN...)."
md '```'
HC_OUT=$WORK/hashcheck.txt
HC_DEV="--device cuda"
gpu || HC_DEV=""  # stand-in: the CPU matrix against the pin
run hash-check "${HC_LIMIT:-420}" bash -c "set -o pipefail; $PY -m intdet hash-check -m $INT --steps $STEPS $HC_DEV --expect $PIN 2>&1 | tee $HC_OUT"
md "$(cat "$HC_OUT" 2>/dev/null || echo 'hash-check did not run')"
md '```'

step "speed"
BENCH_PY=$WORK/bench.py
ROWS=$WORK/bench-rows.jsonl
rm -f "$ROWS"
cat >"$BENCH_PY" <<'PYEOF'
"""Speed rows for device-check.sh: python bench.py intdet|torch-eager|torch-compile MODEL_INT HF ROWS"""
import json
import sys
import time

import numpy as np

which, INT, HF, ROWS = sys.argv[1:5]
V = 302  # ids of the random model's tiny tokenizer


def row(impl, what, rate, note=""):
    print(f"{impl:44s} {what:22s} {rate:10.1f} tok/s  {note}", flush=True)
    with open(ROWS, "a") as f:
        f.write(json.dumps([impl, what, rate, note]) + "\n")


def intdet_bench():
    from intdet.model import Engine, load_model

    eng = Engine(load_model(INT), "cuda", cuda_graphs=False)
    rng = np.random.default_rng(0)
    for graphs in (False, True):
        eng._model.cuda_graphs = graphs
        for batch in (1, 8):
            seqs = [eng.new_state(512) for _ in range(batch)]
            outs = eng.forward_batch(seqs, [list(rng.integers(0, V, 64)) for _ in range(batch)])
            for _ in range(3):  # warm-up (and graph capture)
                outs = eng.forward_batch(seqs, [[int(o[-1].argmax())] for o in outs])
            n = 128
            t = time.perf_counter()
            for _ in range(n):
                outs = eng.forward_batch(seqs, [[int(o[-1].argmax())] for o in outs])
            row("intdet cuda" + (" + CUDA graphs" if graphs else ""), f"decode, batch {batch}",
                batch * n / (time.perf_counter() - t), "int32 logits to host, argmax on host; 64-token prompts")
    from intdet.scheduler import Request, Scheduler

    eng._model.cuda_graphs = True  # the scheduler's device lane: token chosen on the device, hash overlapped
    for _ in range(2):
        sched = Scheduler(eng, max_batch=1, step_tokens=512, kv_bytes=1 << 62)
        req = sched.submit(Request([int(t) for t in rng.integers(0, V, 64)], 257))
        sched.run_until_idle()
    row("intdet cuda + CUDA graphs", "scheduler, batch 1", (len(req.tokens) - 1) / (req.t_done - req.t_first),
        "device lane (submit_pick), chain hash on the host overlapped; 64-token prompt, 256 steps")
    eng._model.cuda_graphs = False
    prompt = list(rng.integers(0, V, 2048))
    best = 0.0
    for _ in range(3):
        s = eng.new_state(2049)
        t = time.perf_counter()
        s.forward(prompt)
        best = max(best, 2048 / (time.perf_counter() - t))
    row("intdet cuda", "prefill 2048 tokens", best, "best of 3")


def torch_bench(compiled):
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(HF, dtype=torch.float16).cuda().eval()
    g = torch.Generator(device="cpu").manual_seed(0)
    label = "torch fp16, HF " + m.config._attn_implementation
    with torch.no_grad():
        if not compiled:
            ids = torch.randint(0, V, (1, 2048), generator=g).cuda()
            best = 0.0
            for _ in range(3):
                torch.cuda.synchronize()
                t = time.perf_counter()
                m(ids, use_cache=False, logits_to_keep=1)
                torch.cuda.synchronize()
                best = max(best, 2048 / (time.perf_counter() - t))
            row(label + ", eager", "prefill 2048 tokens", best, "best of 3")
            for batch in (1, 8):
                ids = torch.randint(0, V, (batch, 64), generator=g).cuda()
                out = m(ids, use_cache=True)
                pkv, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
                for _ in range(3):
                    out = m(nxt, past_key_values=pkv, use_cache=True)
                    pkv, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
                n = 128
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(n):
                    out = m(nxt, past_key_values=pkv, use_cache=True)
                    pkv, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
                torch.cuda.synchronize()
                row(label + ", eager", f"decode, batch {batch}", batch * n / (time.perf_counter() - t),
                    "argmax on GPU")
        else:
            m.forward = torch.compile(m.forward, mode="reduce-overhead", fullgraph=True)
            for batch in (1, 8):
                ids = torch.randint(0, V, (batch, 64), generator=g).cuda()
                kw = dict(do_sample=False, cache_implementation="static", pad_token_id=0)
                m.generate(ids, max_new_tokens=129, min_new_tokens=129, **kw)  # compile and capture
                times = {}
                for n in (1, 129):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    m.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
                    torch.cuda.synchronize()
                    times[n] = time.perf_counter() - t
                row(label + ", torch.compile (CUDA graphs)", f"decode, batch {batch}",
                    batch * 128 / (times[129] - times[1]), "generate() with a static cache; prefill time subtracted")


if which == "intdet":
    intdet_bench()
else:
    torch_bench(which == "torch-compile")
PYEOF
gpu && run bench-intdet 240 $PY "$BENCH_PY" intdet "$INT" "$HF" "$ROWS"

# Per-kernel cudaEvent timing of one decode token (batch 1, after a 64- and a
# 1024-token prompt) and of a 2048-token prefill with either attention path,
# next to the bandwidth bound; in the results file as soon as it is measured.
PROF_PY=$WORK/kernel_profile.py  # not profile.py: that name would shadow the stdlib module cProfile imports (torch.compile)
PROF_OUT=$WORK/profile.md
cat >"$PROF_PY" <<'PYEOF'
"""Per-step cudaEvent tables for device-check.sh: python kernel_profile.py MODEL_INT [BW_BYTES_PER_S [CTX,CTX... [PREFILL]]]

Decode (batch 1) after each prompt length, then a PREFILL-token (2048) prefill with the
attention on the tensor cores (attn_mma_kernel) and on the flash-decoding
split (set_attn_path), the same logits checked equal."""
import sys
from collections import OrderedDict

import numpy as np

from intdet import _cuda
from intdet.model import load_model

INT = sys.argv[1]
BW = float(sys.argv[2]) if len(sys.argv) > 2 else 4.8e12  # H200 HBM3e
CTXS = [int(c) for c in sys.argv[3].split(",")] if len(sys.argv) > 3 else [64, 1024]
PRE = int(sys.argv[4]) if len(sys.argv) > 4 else 2048
lm = load_model(INT)
m = _cuda.Model(lm.cfg, lm.tensors, False)
rng = np.random.default_rng(0)


def table(title, steps, rows):
    agg = OrderedDict()
    for name, ns, nbytes, launches in steps:
        a = agg.setdefault(name, [0, 0, 0])
        a[0] += ns
        a[1] += nbytes
        a[2] += launches
    tot_ns = sum(a[0] for a in agg.values())
    tot_b = sum(a[1] for a in agg.values())
    print(f"\n### {title} ({len(steps)} steps, {sum(a[2] for a in agg.values())} launches)\n")
    print("| step | launches | time (us) | share | bytes read (MB) | GB/s | bound at %.1f TB/s (us) |" % (BW / 1e12))
    print("|---|---|---|---|---|---|---|")
    for name, (ns, nbytes, launches) in agg.items():
        gbs = nbytes / ns if ns else 0.0
        print(f"| {name} | {launches} | {ns / 1e3:.1f} | {100 * ns / tot_ns:.1f}% | {nbytes / 1e6:.2f} | {gbs:.0f} | "
              f"{nbytes / BW * 1e6:.1f} |")
    print(f"| **total** | | {tot_ns / 1e3:.1f} | | {tot_b / 1e6:.1f} | {tot_b / tot_ns:.0f} | {tot_b / BW * 1e6:.1f} |")
    print(f"\nevent-timed: {rows * 1e9 / tot_ns:.0f} tok/s; bandwidth bound {rows * BW / tot_b:.0f} tok/s "
          "(events add a little per step; graphs remove launch gaps)", flush=True)


for ctx in CTXS:
    s = _cuda.State(m, ctx + 8)
    _cuda.forward(m, s, rng.integers(0, 302, ctx).astype(np.int32), 0, False)
    _cuda.profile(m, s, np.array([1], np.int32), ctx)  # warm-up
    _, steps = _cuda.profile(m, s, np.array([2], np.int32), ctx + 1)
    table(f"decode, batch 1, position {ctx + 1}", steps, 1)

prompt = rng.integers(0, 302, PRE).astype(np.int32)
ref = None
try:
    for path, label in ((2, "tensor cores (attn_mma_kernel)"), (1, "flash-decoding split")):
        _cuda.ops.set_attn_path(path)
        _cuda.profile(m, _cuda.State(m, PRE + 8), prompt, 0)  # warm-up
        logits, steps = _cuda.profile(m, _cuda.State(m, PRE + 8), prompt, 0)
        if ref is None:
            ref = logits
        print(f"\nlast-row logits equal to the tensor-core path's: {np.array_equal(logits, ref)}")
        table(f"prefill {PRE} tokens, attention: {label}", steps, PRE)
finally:
    _cuda.ops.set_attn_path(0)
PYEOF
if gpu; then
  run profile 120 bash -c "set -o pipefail; $PY $PROF_PY $INT 2>&1 | tee $PROF_OUT"
  md
  md "## Per-kernel cudaEvent timing (Qwen3-0.6B shape, no graphs)"
  md "$(cat "$PROF_OUT" 2>/dev/null || echo 'profile did not run')"
fi
if gpu && [ -z "${SKIP_TORCH:-}" ]; then
  soft bench-torch-eager 180 $PY "$BENCH_PY" torch-eager "$INT" "$HF" "$ROWS"
  LEFT=$((450 - (SECONDS - START)))
  if [ -z "${SKIP_COMPILE:-}" ] && [ "$LEFT" -gt 60 ]; then
    LIM=$((LEFT < 180 ? LEFT : 180))
    soft bench-torch-compile "$LIM" $PY "$BENCH_PY" torch-compile "$INT" "$HF" "$ROWS"
  else
    echo "torch.compile bench skipped (${LEFT}s left of the 450 s budget, or SKIP_COMPILE)"
  fi
fi
md
md "## Speed (one GPU; random weights: the tokens mean nothing, the work is real)"
md
md "| implementation | measurement | tok/s | note |"
md "|---|---|---|---|"
if [ -f "$ROWS" ]; then
  $PY -c "
import json, sys
for line in open(sys.argv[1]):
    impl, what, rate, note = json.loads(line)
    print(f'| {impl} | {what} | {rate:.1f} | {note} |')
" "$ROWS" >>"$RES"
fi

step "compute-sanitizer memcheck on the op tests (if time is left)"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
LEFT=$((470 - (SECONDS - START)))
if gpu && [ -x "$SAN" ] && [ "$LEFT" -gt 45 ]; then
  SAN_OUT=$WORK/sanitizer.txt
  soft memcheck "$LEFT" bash -c "set -o pipefail; $SAN --tool memcheck --error-exitcode 3 $PY -m pytest -q -p no:cacheprovider tests/engine/test_cuda.py -k 'gpu and (linear or attend or swiglu or norm or round_div)' 2>&1 | tail -n 25 | tee $SAN_OUT"
  md
  md "## compute-sanitizer memcheck (op tests)"
  md '```'
  md "$(cat "$SAN_OUT" 2>/dev/null)"
  md '```'
else
  echo "memcheck skipped (${LEFT}s left, or no compute-sanitizer)"
fi

md
md "## Summary"
if [ ${#FAILED[@]} -eq 0 ]; then
  md "All steps passed in $((SECONDS - START)) s."
else
  md "Failed steps: ${FAILED[*]} ($((SECONDS - START)) s in all; see device-check.log)."
fi
if [ ${#WARNED[@]} -ne 0 ]; then md "Comparison runs that failed (not counted): ${WARNED[*]}."; fi
# The results belong in docs/ only when a GPU really ran them.
if $PY -c "import intdet._cuda as c; raise SystemExit(c.device_count() < 1)" 2>/dev/null; then
  cp "$RES" "$ROOT/docs/" 2>/dev/null || true
fi
step "done: results in $RES"
cat "$RES"
if [ ${#FAILED[@]} -ne 0 ]; then
  echo "FAILED: ${FAILED[*]}"
  exit 1
fi
