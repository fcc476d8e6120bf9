#!/usr/bin/env bash
# scripts/device-check.sh: the CUDA backend's check and the side-by-side
# benchmark (issue 50) on a lent GPU machine (H100/H200: python3 3.12 with
# torch, transformers, pybind11, scikit-build-core, xxhash, click,
# safetensors, tokenizers, sentencepiece; nvcc 13.0; cuobjdump; 16 cores,
# 64 GiB disk; no network). One run, at most BUDGET = 420 s (7 minutes):
#   0. in the background from the start: the random models (intdet random-model
#      --jobs, the same bytes as one process) of the Qwen3-0.6B shape (seed 0)
#      and the Llama-3-8B shape, each converted by `intdet convert` (int8) and by
#      llama.cpp's own convert_hf_to_gguf.py (Q8_0; its vendored source, carried)
#   1. build intdet in place with the CUDA module (pip install -e .)
#   2. scripts/check_sass.py on the built module (no float instruction)
#   3. python -m pytest tests/engine/test_cuda.py (GPU tests)
#   4. Qwen3-0.6B shape: `intdet hash-check --device cuda --steps 16 --expect PIN`
#      (the CPU run must give the pinned hash, computed on x86 CPUs, docs/cuda.md,
#      and every GPU configuration the same bits), then scripts/hash_batches.py:
#      the same generation inside batches of 1, 8, 64 and 256 (CUDA graphs)
#   5. speed, per model (Qwen3-0.6B, then Llama-3-8B), on the same weights:
#      intdet (scripts/bench_intdet_gpu.py: decode at batch 1, 8, 64, 256 after
#      a 512-token prompt, 64 steps; prefill of 2048 tokens), torch fp16
#      (scripts/torch_decode.py: gpt-fast style, static KV cache, SDPA, CUDA
#      graphs) and llama.cpp last, its GGUF being made last (llama-bench -fa on:
#      pp2048 and tg128; llama-batched-bench -fa on -pps: the same decode batches
#      after the same 512-token prompt)
#   6. --device webgpu through Vulkan, if this intdet has it and a GPU adapter
#      opens (scripts/webgpu_ready.py; else the reason is printed), Qwen3 shape:
#      the pinned hash inside batches of 1 and 8, decode speed at batch 1 and 8
#   7. results: device-results-<date>.md and .json (scripts/bench_results.py:
#      {"device", "hashes_equal", "rows"}) with the ratios intdet / llama.cpp and
#      intdet / torch
#   8. if time is left: scripts/bench_div.py, per-kernel cudaEvent tables
#      (scripts/cuda_kernel_profile.py), compute-sanitizer memcheck
# Every step's time limit is cut to what is left of BUDGET (RESERVE seconds kept
# for step 7), so a slow step costs the later ones, never the results files.
# Results: $OUT/device-results-<date>.{md,json} (and docs/ in this working copy
# when a GPU ran them), the full log in $OUT/device-check.log.
#
# Carried (git-ignored; the device tool's `carry`), made here first:
#   carry: ["wheels", "build/llama-cuda"]   (add ".gl" for webgpu: the Vulkan loaders, device README)
#   wheels/           bash scripts/fetch-device-wheels.sh (gguf, nlohmann-json: the GPU image lacks
#                     them; wheels/webgpu/: wgpu, cffi, pycparser, rendercanvas for Python 3.12)
#   build/llama-cuda/ bash scripts/build_llama_cuda.sh (llama-bench, llama-batched-bench and ggml's
#                     shared libraries for sm_90, stripped; convert/ holds the same source's converter)
# Together with the tracked files they must stay under the tool's 64 MiB
# (2026-12-07: 53.4 + 4.3 + 3.3 MB).
#
# Usage (device tool, from the repo root):  bash scripts/device-check.sh   (timeout_s 450: the
#   420 s budget and slack for the summary; with the machine's start that is about 9 of
#   the 15 minutes, leaving one shorter rerun on the warm machine, which keeps
#   build/device and the models in WORK: e.g. SKIP_8B=1 BUDGET=200)
# Rehearsal on a machine without a GPU:     bash scripts/rehearse-device-check.sh
#   (STANDIN=1: every step but the GPU ones, on the CPU backend with small sizes:
#   wheels, the CUDA build, the SASS check, the Qwen3 model, its pinned sha256 and
#   the CPU hash-check against PIN, hash_batches on the CPU, every benchmark
#   program on the CPU with backend "cpu" rows, llama.cpp's programs if
#   build/llama-cuda is there (they fall back to the CPU), webgpu on whatever
#   adapter there is, and the results JSON; the Llama-3-8B shape is replaced by
#   tiny-llama; no budget)
# Environment: OUT (results folder; default build/device-out), PIN (expected greedy
# hash; default below), STEPS (hash steps, default 16), STANDIN=1, SKIP_TORCH=1,
# SKIP_LLAMACPP=1, SKIP_8B=1, BUDGET (seconds for the whole run; default 420 on a
# GPU), RESERVE (default 15), BUILD_LIMIT, HC_LIMIT (seconds for the build and
# hash-check steps; default 420 each), LLAMA_DIR (default build/llama-cuda),
# LLAMA_LIBS (extra folders with libcublas.so.13 / libcudart.so.13 for llama.cpp),
# WORK (default /tmp/intdet-device).
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
RES_JSON=$OUTDIR/device-results-$DATE.json
WORK=${WORK:-/tmp/intdet-device}
mkdir -p "$WORK"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
STANDIN=${STANDIN:-}
gpu() { [ -z "$STANDIN" ]; }  # the GPU steps run only on a real device
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
# The whole run ends inside BUDGET seconds (device: about 7 minutes, under the
# tool's timeout_s with room for the tool's own start): every step's time
# limit is cut to what is left, RESERVE seconds kept for the results.
if gpu; then BUDGET=${BUDGET:-420}; else BUDGET=${BUDGET:-100000}; fi
RESERVE=${RESERVE:-15}
LLAMA_DIR=${LLAMA_DIR:-$ROOT/build/llama-cuda}
exec > >(tee -a "$LOG") 2>&1

# Sizes: the benchmark's on a GPU; small ones for the rehearsal on 2 CPU cores.
if gpu; then
  DEV=cuda BATCHES=1,8,64,256 PROMPT=512 DEC_STEPS=64 PREFILL=2048 LB_GEN=128 LB_REPS=3 WG_BATCHES=1,8 WG_STEPS=32
  WG_HASH_LIMIT=90
  BIG=llama3-8b BIG_SHAPE=llama3-8b JOBS=8 WAIT=300
else
  DEV=cpu BATCHES=1,2 PROMPT=16 DEC_STEPS=4 PREFILL=64 LB_GEN=8 LB_REPS=1 WG_BATCHES=1 WG_STEPS=2
  WG_HASH_LIMIT=400  # the pin's 16 steps of the Qwen3 shape on lavapipe: ~140 s on 2 cores
  BIG=llama3-8b BIG_SHAPE=tiny-llama JOBS=2 WAIT=3000  # rows named llama3-8b, from the tiny Llama: the code path
fi
NPL_MAX=${BATCHES##*,}
ROWS=$WORK/rows.jsonl
rm -f "$ROWS"

FAILED=()
WARNED=()
START=$SECONDS
step() { echo; echo "=== [$((SECONDS - START))s] $*"; }
# Seconds left of BUDGET, RESERVE kept back for the results and summary.
left() { echo $((BUDGET - RESERVE - (SECONDS - START))); }
# clamp LIMIT: LIMIT, or less so that the step ends inside the budget
clamp() { local l=$1 r; r=$(left); echo $((l < r ? l : r)); }
# step_cmd KIND NAME TIMEOUT CMD...: runs a step under timeout (run, soft: cut
# to the budget, not started with under 5 s left); a failure goes to WARNED
# (soft: comparisons) or FAILED (run, always), never fatal.
step_cmd() {
  local kind=$1 name=$2 limit=$3
  [ "$kind" = always ] || limit=$(clamp "$3")
  shift 3
  local t0=$SECONDS rc=0
  if [ "$limit" -lt 5 ]; then
    echo "--- $name: not run (the ${BUDGET} s budget is spent)"
    rc=budget
  else
    timeout --kill-after=10 "$limit" "$@" || rc=$?
    echo "--- $name: rc=$rc ($((SECONDS - t0)) s)"
  fi
  if [ "$rc" != 0 ]; then
    if [ "$kind" = soft ]; then WARNED+=("$name (rc=$rc)"); else FAILED+=("$name (rc=$rc)"); fi
  fi
  return 0
}
run() { step_cmd run "$@"; }
soft() { step_cmd soft "$@"; }
always() { step_cmd always "$@"; }  # the results: not cut to the budget (RESERVE is kept for them)

{
  echo "# intdet on a GPU: device check and side-by-side benchmark, $DATE"
  echo
  echo "Written by scripts/device-check.sh${STANDIN:+ (STANDIN rehearsal on the CPU: no GPU numbers)}."
  echo
} >"$RES"
md() { echo "$*" >>"$RES"; }

step "environment"
smi() { if command -v nvidia-smi >/dev/null; then nvidia-smi "$@" 2>&1; else echo "no nvidia-smi (no GPU driver here)"; fi; }
smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
$PY -V
command -v nvcc && nvcc --version | tail -2 || echo "no nvcc on PATH"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" || true
echo "cores $(nproc); free disk under $WORK: $(df -h --output=avail "$WORK" | tail -1)"
md "## Environment"
md '```'
md "$(smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true)"
md "$($PY -V 2>&1); $( (nvcc --version | tail -1) 2>&1 || echo no nvcc); $(nproc) cores"
md "$($PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| transformers', transformers.__version__)" 2>&1 | tail -1)"
md '```'

step "carried wheels"
if compgen -G "wheels/*.whl" >/dev/null; then
  run wheels 120 $PY -m pip install -q --no-index --no-deps --find-links wheels/ wheels/*.whl
else
  echo "no wheels/ folder (bash scripts/fetch-device-wheels.sh makes it): gguf and nlohmann-json must already be installed"
fi
run deps 30 $PY -c "import gguf, nlohmann_json; print('gguf', gguf.__file__)"

# ---------------------------------------------------------------- models (background)
# Each model folder gets hf/, int/ (intdet) and q8_0.gguf (llama.cpp), and a
# file <part>.done or <part>.failed per part; the foreground waits for them.
CONVERTER=${LLAMACPP_CONVERT:-$LLAMA_DIR/convert}
if [ ! -f "$CONVERTER/convert_hf_to_gguf.py" ] && ! gpu; then
  CONVERTER=$(bash scripts/fetch_llamacpp_convert.sh 2>/dev/null || echo "$CONVERTER")  # the rehearsal may fetch it
fi
GGUF_RUNNER=$($PY -c "import sys; sys.path.insert(0, 'scripts'); import bench_cpu; print(bench_cpu._LLAMACPP_RUNNER)")
part() {  # part DIR NAME CMD...: run CMD, logging to DIR/NAME.log, marking DIR/NAME.done or .failed
  local d=$1 name=$2 t0=$SECONDS
  shift 2
  if "$@" >"$d/$name.log" 2>&1; then echo $((SECONDS - t0)) >"$d/$name.done"; else echo $((SECONDS - t0)) >"$d/$name.failed"; fi
}
prepare_hf() {  # prepare_hf NAME SHAPE PRE: the checkpoint, then its GGUF in the background
  local name=$1 shape=$2 pre=$3 d=$WORK/$1
  mkdir -p "$d"
  rm -f "$d"/*.done "$d"/*.failed "$d"/*.partial
  # what a run stopped at its budget left: random-model's and convert's temporary folders
  find "$d" -mindepth 1 -maxdepth 1 -name '.*' -exec rm -rf {} +
  if [ -f "$d/hf/config.json" ]; then echo 0 >"$d/hf.done"; else
    rm -rf "$d/hf"
    # random-model is pure Python: it runs from the source tree while intdet builds
    part "$d" hf env PYTHONPATH="$ROOT/python" $PY -m intdet random-model "$d/hf" --shape "$shape" --seed 0 --jobs "$JOBS"
  fi
  [ -f "$d/hf.done" ] || return 0
  if [ -f "$d/q8_0.gguf" ]; then echo 0 >"$d/gguf.done"; else
    # llama.cpp's converter, one process; the tiny test tokenizer is not in its
    # pre-tokenizer table, so the runner names one (tests/llamacpp_convert.py)
    part "$d" gguf to_gguf "$d" "$pre" &
  fi
}
to_gguf() {  # to_gguf DIR PRE: DIR/hf -> DIR/q8_0.gguf, whole or not at all (renamed before .done is written)
  env NO_LOCAL_GGUF=1 $PY -c "$GGUF_RUNNER" "$CONVERTER" "$2" "$1/hf" --outfile "$1/q8_0.gguf.partial" --outtype q8_0 &&
    mv "$1/q8_0.gguf.partial" "$1/q8_0.gguf"
}
prepare_int() {  # prepare_int NAME: intdet convert, once the foreground's build step is done
  local d=$WORK/$1
  [ -f "$d/hf.done" ] || return 0
  if [ -f "$d/int/model.safetensors" ]; then echo 0 >"$d/int.done"; return 0; fi
  while [ ! -f "$WORK/build.done" ] && [ ! -f "$WORK/build.failed" ]; do sleep 1; done
  if [ -f "$WORK/build.done" ]; then
    part "$d" int $PY -m intdet convert "$d/hf" -o "$d/int" --force
  else
    echo "the build failed" >"$d/int.log"
    echo 0 >"$d/int.failed"
  fi
}
# wait_part NAME PART LIMIT: wait until the part is done (0) or failed / late (1, recorded)
wait_part() {
  local d=$WORK/$1 t0=$SECONDS lim
  lim=$(clamp "$3")
  while [ ! -f "$d/$2.done" ] && [ ! -f "$d/$2.failed" ] && [ $((SECONDS - t0)) -lt "$lim" ]; do sleep 1; done
  if [ -f "$d/$2.done" ]; then
    echo "--- $1 $2 ready (made in $(cat "$d/$2.done") s; waited $((SECONDS - t0)) s)"
    return 0
  fi
  echo "--- $1 $2: $( [ -f "$d/$2.failed" ] && echo failed || echo "not ready after $((SECONDS - t0)) s"); log: $d/$2.log"
  tail -5 "$d/$2.log" 2>/dev/null || true
  FAILED+=("$1 $2")
  return 1
}
step "models, in the background: qwen3-0.6b, then $BIG ($BIG_SHAPE)"
FREE_GB=$(df -BG --output=avail "$WORK" | tail -1 | tr -dc 0-9)
if [ -z "${SKIP_8B:-}" ] && gpu && [ ! -f "$WORK/$BIG/q8_0.gguf" ] && [ "$FREE_GB" -lt 40 ]; then
  echo "only ${FREE_GB} GB free under $WORK: the $BIG shape (16 + 8 + 8.5 GB) is skipped"
  SKIP_8B=1
fi
rm -f "$WORK/build.done" "$WORK/build.failed"
(
  prepare_hf qwen3-0.6b qwen3-0.6b qwen2
  prepare_int qwen3-0.6b &  # the hash-check needs it first: not behind the big model
  if [ -z "${SKIP_8B:-}" ]; then
    prepare_hf "$BIG" "$BIG_SHAPE" llama-bpe
    prepare_int "$BIG"
  fi
  wait
) &
PREP_PID=$!
# kill_tree PID: PID and every process under it (the model preparation still
# running when the budget is spent: its files are not needed any more)
kill_tree() {
  local c
  for c in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$c"; done
  kill "$1" 2>/dev/null || true
}

step "build (pip install -e . with CUDA)"
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
run build "${BUILD_LIMIT:-420}" $PY -m pip install -q --no-build-isolation --no-index --no-deps -e . \
  -Ccmake.define.INTDET_CUDA=ON -Cbuild-dir=build/device
NF=${#FAILED[@]}
run import 60 $PY -c "import intdet._cuda as c, os; n = c.device_count(); print('devices', n, c.device_name() if n else c.no_device_reason()); assert n > 0 or os.environ.get('STANDIN')"
if [ ${#FAILED[@]} -eq "$NF" ]; then touch "$WORK/build.done"; else touch "$WORK/build.failed"; fi  # the model conversions wait for it
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

# ---------------------------------------------------------------- hashes
step "random Qwen3-0.6B-shaped model: hash-check against the pin"
Q=$WORK/qwen3-0.6b
HASHES_OK=yes
if wait_part qwen3-0.6b int "$WAIT"; then
  MODEL_SHA=$( (sha256sum "$Q/int/model.safetensors" | cut -c1-16) 2>/dev/null || echo missing)
else
  MODEL_SHA=missing
  HASHES_OK=no
fi
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
NF=${#FAILED[@]}
run hash-check "${HC_LIMIT:-420}" bash -c "set -o pipefail; $PY -m intdet hash-check -m $Q/int --steps $STEPS $HC_DEV --expect $PIN 2>&1 | tee $HC_OUT"
HB_OUT=$WORK/hash-batches.txt
HB_GRAPHS=""
gpu && HB_GRAPHS="--graphs"
run hash-batches 240 bash -c "set -o pipefail; $PY scripts/hash_batches.py $Q/int --device $DEV $HB_GRAPHS --batches $BATCHES --steps $STEPS --expect $PIN 2>&1 | tee $HB_OUT"
[ ${#FAILED[@]} -eq "$NF" ] || HASHES_OK=no
md "$(cat "$HC_OUT" 2>/dev/null || echo 'hash-check did not run')"
md
md "$(cat "$HB_OUT" 2>/dev/null || echo 'hash_batches did not run')"
md '```'

# ---------------------------------------------------------------- speed
LLAMA_LD=""
if [ -z "${SKIP_LLAMACPP:-}" ] && [ -x "$LLAMA_DIR/llama-bench" ]; then
  # cuBLAS and the CUDA runtime: the image's torch wheels (nvidia/cu13/lib), else the toolkit
  LLAMA_LD=$($PY - <<'PYEOF'
import glob, os, site
dirs = []
for root in site.getsitepackages() + [site.getusersitepackages(), "/usr/local/cuda/lib64"]:
    for lib in ("libcublas.so.13", "libcudart.so.13"):
        for p in glob.glob(os.path.join(root, "nvidia", "*", "lib", lib)) + glob.glob(os.path.join(root, lib)):
            if os.path.dirname(p) not in dirs:
                dirs.append(os.path.dirname(p))
print(":".join(dirs))
PYEOF
)
  LLAMA_LD=$LLAMA_DIR${LLAMA_LIBS:+:$LLAMA_LIBS}${LLAMA_LD:+:$LLAMA_LD}
  echo "llama.cpp: $LLAMA_DIR ($(cat "$LLAMA_DIR/VERSION" 2>/dev/null)), LD_LIBRARY_PATH=$LLAMA_LD"
else
  echo "llama.cpp: no $LLAMA_DIR/llama-bench (bash scripts/build_llama_cuda.sh makes it) or SKIP_LLAMACPP: skipped"
  if gpu && [ -z "${SKIP_LLAMACPP:-}" ]; then FAILED+=("llama.cpp binaries missing"); fi
fi

bench_model() {  # bench_model NAME: the three engines on one model's files (llama.cpp last: its GGUF is made last)
  local name=$1 d=$WORK/$1
  step "speed: $name, intdet"
  if wait_part "$name" int "$WAIT"; then
    run "bench-intdet-$name" 300 $PY scripts/bench_intdet_gpu.py "$d/int" "$ROWS" --model "$name" --device "$DEV" \
      --batches "$BATCHES" --prompt "$PROMPT" --steps "$DEC_STEPS" --prefill "$PREFILL" --prefill-ab
  fi
  if [ -z "${SKIP_TORCH:-}" ]; then
    step "speed: $name, torch fp16 (scripts/torch_decode.py)"
    if wait_part "$name" hf "$WAIT"; then
      soft "torch-$name" 300 $PY scripts/torch_decode.py "$d/hf" "$ROWS" --model "$name" --device "$DEV" \
        --batches "$BATCHES" --prompt "$PROMPT" --steps "$DEC_STEPS" --prefill "$PREFILL"
    fi
  fi
  if [ -n "$LLAMA_LD" ]; then
    step "speed: $name, llama.cpp (llama-bench, llama-batched-bench)"
    if wait_part "$name" gguf "$WAIT"; then
      soft "llama-bench-$name" 180 bash -c "env LD_LIBRARY_PATH='$LLAMA_LD' '$LLAMA_DIR/llama-bench' -m '$d/q8_0.gguf' \
        -ngl 99 -fa on -p $PREFILL -n $LB_GEN -r $LB_REPS -o jsonl >'$d/llama-bench.txt' 2>'$d/llama-bench.log'; \
        rc=\$?; cat '$d/llama-bench.txt'; [ \$rc -eq 0 ] || tail -20 '$d/llama-bench.log'; exit \$rc"
      soft "rows-llama-bench-$name" 30 $PY scripts/bench_results.py add-llama-bench "$ROWS" "$name" "$d/llama-bench.txt" \
        --backend "$DEV"
      # every row its own KV cells (not unified): NPL_MAX x (prompt + steps); -pps: the prompt computed once
      soft "llama-batched-bench-$name" 240 bash -c "env LD_LIBRARY_PATH='$LLAMA_LD' '$LLAMA_DIR/llama-batched-bench' \
        -m '$d/q8_0.gguf' -ngl 99 -fa on -c $((NPL_MAX * (PROMPT + DEC_STEPS))) -b 2048 -ub 512 -npp $PROMPT \
        -ntg $DEC_STEPS -npl $BATCHES -pps --output-format jsonl >'$d/batched-bench.txt' 2>&1; \
        rc=\$?; grep '^{' '$d/batched-bench.txt'; [ \$rc -eq 0 ] || tail -20 '$d/batched-bench.txt'; exit \$rc"
      soft "rows-batched-bench-$name" 30 $PY scripts/bench_results.py add-batched-bench "$ROWS" "$name" \
        "$d/batched-bench.txt" --backend "$DEV"
    fi
  fi
}
bench_model qwen3-0.6b

if [ -z "${SKIP_8B:-}" ]; then
  bench_model "$BIG"
fi
step "webgpu (Qwen3 shape, through Vulkan), if this intdet has the device"
if gpu; then
  # The Vulkan loaders carried as .debs (the device README), the NVIDIA driver's ICD,
  # and wgpu with what it needs (wheels/webgpu/, Python 3.12: fetch-device-wheels.sh)
  if compgen -G ".gl/*.deb" >/dev/null; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
  fi
  ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$ICD" ]; then export VK_DRIVER_FILES=$ICD; fi
  if compgen -G "wheels/webgpu/*.whl" >/dev/null && ! $PY -c "import wgpu" 2>/dev/null; then
    soft wheels-webgpu 60 $PY -m pip install -q --no-index --no-deps wheels/webgpu/*.whl
  fi
  WG_REQ=--require-gpu
else
  WG_REQ=""  # the rehearsal: a CPU adapter (llvmpipe) rehearses the commands
fi
WG_WHY=$($PY scripts/webgpu_ready.py $WG_REQ 2>&1 | tail -1) && WG_OK=yes || WG_OK=""
echo "webgpu: $WG_WHY"
if [ -n "$WG_OK" ] && [ -f "$Q/int/model.safetensors" ]; then
  WG_OUT=$WORK/hash-webgpu.txt
  NF=${#FAILED[@]}
  run hash-webgpu "$WG_HASH_LIMIT" bash -c "set -o pipefail; $PY scripts/hash_batches.py $Q/int --device webgpu --batches ${WG_BATCHES} --steps $STEPS --expect $PIN 2>&1 | tee $WG_OUT"
  [ ${#FAILED[@]} -eq "$NF" ] || HASHES_OK=no
  soft bench-webgpu 90 $PY scripts/bench_intdet_gpu.py "$Q/int" "$ROWS" --model qwen3-0.6b --device webgpu \
    --batches "$WG_BATCHES" --prompt "$PROMPT" --steps "$WG_STEPS" --prefill 0
  md
  md "## --device webgpu (Qwen3-0.6B shape; ${WG_WHY#ready: })"
  md '```'
  md "$(cat "$WG_OUT" 2>/dev/null || echo 'webgpu hash did not run')"
  md '```'
else
  md
  md "--device webgpu: skipped ($WG_WHY)."
fi

if kill -0 "$PREP_PID" 2>/dev/null; then
  echo "model preparation still running at $((SECONDS - START)) s: stopped"
  kill_tree "$PREP_PID"
fi
wait "$PREP_PID" 2>/dev/null || true

step "results"
DEVICE_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
[ -n "$DEVICE_NAME" ] || DEVICE_NAME="no GPU (STANDIN rehearsal: $(nproc) CPU cores)"
md
md "## Speed, side by side (same random weights: the tokens mean nothing, the work is real)"
md
md "intdet: scripts/bench_intdet_gpu.py (int8 weights, integer arithmetic, CUDA graphs; every row's int32 logits"
md "to the host each step). llama.cpp: Q8_0 GGUF from its own converter, llama-bench -fa on (pp$PREFILL, tg$LB_GEN"
md "from depth 0) and llama-batched-bench -fa on -pps (decode after the shared $PROMPT-token prompt). torch:"
md "scripts/torch_decode.py (fp16, static KV cache, SDPA, CUDA graphs, argmax on the GPU). Decode rows: $DEC_STEPS"
md "steps after a $PROMPT-token prompt; tokens = the prompt length."
md
always results 30 $PY scripts/bench_results.py write "$ROWS" --device "$DEVICE_NAME" --hashes-equal "$HASHES_OK" \
  --json "$RES_JSON" --md "$RES" --backend "$DEV"

# ---------------------------------------------------------------- extras, if time is left
step "division microbenchmark (scripts/bench_div.py), if time is left ($(left) s)"
DIV_OUT=$WORK/bench-div.txt
if [ "$(left)" -gt 60 ]; then
  DIV_EMU=""
  gpu || DIV_EMU="--emu"  # stand-in: the host emulator (the checks, not the times)
  soft div-bench 60 bash -c "set -o pipefail; $PY scripts/bench_div.py $DIV_EMU 2>&1 | tee $DIV_OUT"
  md
  md "## Division microbenchmark (udiv_u64 against DivBy; ns per int64 division${DIV_EMU:+, on the host emulator: the checks only, not GPU times})"
  md '```'
  md "$(cat "$DIV_OUT" 2>/dev/null || echo 'bench_div did not run')"
  md '```'
fi

step "per-kernel cudaEvent timing, if time is left ($(left) s)"
if gpu && [ "$(left)" -gt 60 ]; then
  PROF_OUT=$WORK/profile.md
  BW=4.8e12  # HBM bandwidth for the bound column: H200 4.8 TB/s, H100 SXM 3.35 TB/s
  case "$DEVICE_NAME" in *H100*) BW=3.35e12 ;; esac
  soft profile 90 bash -c "set -o pipefail; $PY scripts/cuda_kernel_profile.py $Q/int --bw $BW 2>&1 | tee $PROF_OUT"
  md
  md "## Per-kernel cudaEvent timing (Qwen3-0.6B shape, no graphs)"
  md "$(cat "$PROF_OUT" 2>/dev/null || echo 'profile did not run')"
fi

step "compute-sanitizer memcheck on the op tests, if time is left ($(left) s)"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if gpu && [ -x "$SAN" ] && [ "$(left)" -gt 45 ]; then
  SAN_OUT=$WORK/sanitizer.txt
  soft memcheck "$(left)" bash -c "set -o pipefail; $SAN --tool memcheck --error-exitcode 3 $PY -m pytest -q -p no:cacheprovider tests/engine/test_cuda.py -k 'gpu and (linear or attend or swiglu or norm or round_div)' 2>&1 | tail -n 25 | tee $SAN_OUT"
  md
  md "## compute-sanitizer memcheck (op tests)"
  md '```'
  md "$(cat "$SAN_OUT" 2>/dev/null)"
  md '```'
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
if gpu && $PY -c "import intdet._cuda as c; raise SystemExit(c.device_count() < 1)" 2>/dev/null; then
  cp "$RES" "$ROOT/docs/" 2>/dev/null || true
  [ -f "$RES_JSON" ] && cp "$RES_JSON" "$ROOT/docs/" 2>/dev/null || true
fi
step "done: results in $RES and $RES_JSON"
cat "$RES"
if [ ${#FAILED[@]} -ne 0 ]; then
  echo "FAILED: ${FAILED[*]}"
  exit 1
fi
