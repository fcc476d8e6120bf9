#!/usr/bin/env bash
# Cross-architecture evidence for the chain hash (docs/chain-hash.md).
#
# Builds csrc/tools/intdet_run (CMake, INTDET_TOOLS=ON, no Python) for the
# host, for aarch64 and for s390x (big-endian), statically linked, runs the
# foreign ones under qemu-user, and prints the chain hash each prints for the
# same model and prompt, plus the Python `intdet generate` hash when the
# Python package is importable. Exits 1 when any two hashes differ.
#
# Usage: scripts/cross/build_and_run.sh [MODEL_DIR] [--ids 5,17,99] [-n 16]
#   MODEL_DIR  a converted intdet model directory; default: a tiny Qwen3
#              (tests/models.py) converted into $BUILD_ROOT/model (needs the
#              intdet Python package).
# Environment:
#   BUILD_ROOT       build directory (default build/cross, ignored by git)
#   CROSS_ARCHS      foreign targets (default "aarch64 s390x")
#   INTDET_NO_APT=1  do not apt-get install missing toolchains
#
# Toolchains (Debian/Ubuntu): apt-get install -y --no-install-recommends \
#   cmake make g++ libxxhash-dev g++-aarch64-linux-gnu g++-s390x-linux-gnu qemu-user-static
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)

MODEL=""
IDS="5,17,99"
N=16
while [ $# -gt 0 ]; do
  case "$1" in
    --ids) IDS="$2"; shift 2 ;;
    -n) N="$2"; shift 2 ;;
    -h|--help) sed -n 2,21p "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) MODEL="$1"; shift ;;
  esac
done
BUILD_ROOT=${BUILD_ROOT:-$ROOT/build/cross}
CROSS_ARCHS=${CROSS_ARCHS:-"aarch64 s390x"}
HOST_ARCH=$(uname -m)
JOBS=$(nproc 2>/dev/null || echo 2)
mkdir -p "$BUILD_ROOT"

# ---- toolchains
need_pkgs=()
command -v cmake >/dev/null || need_pkgs+=(cmake)
command -v make >/dev/null || need_pkgs+=(make)
command -v c++ >/dev/null || need_pkgs+=(g++)
[ -f /usr/include/xxhash.h ] || need_pkgs+=(libxxhash-dev)
for a in $CROSS_ARCHS; do
  [ "$a" = "$HOST_ARCH" ] && continue
  command -v "$a-linux-gnu-g++" >/dev/null || need_pkgs+=("g++-$a-linux-gnu")
  command -v "qemu-$a-static" >/dev/null || command -v "qemu-$a" >/dev/null || need_pkgs+=(qemu-user-static)
done
if [ ${#need_pkgs[@]} -gt 0 ] && [ "${INTDET_NO_APT:-0}" != 1 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  echo "== installing: ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  avail=()
  for p in $(printf '%s\n' "${need_pkgs[@]}" | sort -u); do
    if apt-cache show "$p" >/dev/null 2>&1; then avail+=("$p"); else echo "== package $p is not available here"; fi
  done
  [ ${#avail[@]} -gt 0 ] && $SUDO apt-get install -y -qq --no-install-recommends "${avail[@]}" >/dev/null
fi

# ---- model
if [ -z "$MODEL" ]; then
  MODEL="$BUILD_ROOT/model"
  if [ ! -f "$MODEL/model.safetensors" ]; then
    echo "== making a tiny qwen3 model in $MODEL"
    python - "$BUILD_ROOT" <<'EOF'
import os, sys
sys.path.insert(0, "tests")
import models
from intdet.convert import convert
root = sys.argv[1]
src = models.write_hf_model(os.path.join(root, "hf-qwen3"), "qwen3")
convert(src, os.path.join(root, "model"), force=True, progress=False)
EOF
  fi
fi

# ---- build: build_one ARCH (host arch = native build)
build_one() {
  local a=$1 dir="$BUILD_ROOT/$1" args=(-DINTDET_PYTHON=OFF -DINTDET_TOOLS=ON -DCMAKE_BUILD_TYPE=Release)
  if [ "$a" != "$HOST_ARCH" ]; then
    local cxx="$a-linux-gnu-g++"
    # -static: runs under qemu-user without a target sysroot. CMake's OpenMP
    # module picks libgomp.so, which cannot link statically: point it at .a.
    args+=(-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR="$a" -DCMAKE_CXX_COMPILER="$cxx"
           -DCMAKE_EXE_LINKER_FLAGS=-static -DOpenMP_gomp_LIBRARY="$("$cxx" -print-file-name=libgomp.a)")
  fi
  cmake -S "$ROOT" -B "$dir" "${args[@]}" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" --target intdet_run -j "$JOBS" >"$dir.build.log" 2>&1 || { cat "$dir.build.log"; return 1; }
}

# run_one ARCH -> prints intdet_run's stdout
run_one() {
  local a=$1 bin="$BUILD_ROOT/$1/intdet_run" runner=()
  if [ "$a" != "$HOST_ARCH" ]; then
    if command -v "qemu-$a-static" >/dev/null; then runner=("qemu-$a-static")
    else runner=("qemu-$a" -L "/usr/$a-linux-gnu"); fi
  fi
  "${runner[@]}" "$bin" "$MODEL" --ids "$IDS" -n "$N"
}

declare -A HASH
status=0
for a in "$HOST_ARCH" $CROSS_ARCHS; do
  if [ "$a" != "$HOST_ARCH" ]; then
    if ! command -v "$a-linux-gnu-g++" >/dev/null; then echo "== $a: SKIPPED (no $a-linux-gnu-g++; package g++-$a-linux-gnu)"; continue; fi
    if ! command -v "qemu-$a-static" >/dev/null && ! command -v "qemu-$a" >/dev/null; then
      echo "== $a: SKIPPED (no qemu-$a-static / qemu-$a; package qemu-user-static)"; continue
    fi
  fi
  t0=$(date +%s)
  build_one "$a"
  t1=$(date +%s)
  out=$(run_one "$a" 2>"$BUILD_ROOT/$a.run.err") || { cat "$BUILD_ROOT/$a.run.err"; status=1; continue; }
  t2=$(date +%s)
  HASH[$a]=$(printf '%s\n' "$out" | awk '$1 == "hash" {print $2}')
  echo "== $a: build $((t1 - t0)) s, run $((t2 - t1)) s; $(cat "$BUILD_ROOT/$a.run.err")"
  printf '%s\n' "$out" | sed 's/^/   /'
done

if python -c "import intdet._core" 2>/dev/null; then
  HASH[python]=$(python -m intdet.cli generate -m "$MODEL" --ids "$IDS" -n "$N" --json 2>/dev/null |
    python -c "import json, sys; print(json.load(sys.stdin)['hash'])")
fi

echo "== chain hashes (model $MODEL, --ids $IDS, -n $N)"
ref=""
for k in python "$HOST_ARCH" $CROSS_ARCHS; do
  [ -n "${HASH[$k]:-}" ] || continue
  printf '   %-8s %s\n' "$k" "${HASH[$k]}"
  [ -z "$ref" ] && ref=${HASH[$k]}
  [ "${HASH[$k]}" = "$ref" ] || status=1
done
if [ $status = 0 ]; then echo "== all equal"; else echo "== MISMATCH or failure"; fi
exit $status
