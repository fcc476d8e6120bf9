#!/usr/bin/env bash
# scripts/rehearse-device-check.sh: rehearse scripts/device-check.sh on a
# machine without a GPU before spending device time. It fetches the carried
# wheels (fetch-device-wheels.sh), makes a copy of the current virtual
# environment without the packages the GPU image lacks (so the wheels/
# install is really exercised), and runs device-check.sh there with
# STANDIN=1: every step but the GPU ones, with small sizes and no time budget
# (wheels, the CUDA build in place, the SASS check, the random Qwen3-0.6B model
# and its pinned sha256, the CPU hash-check and hash_batches against the pinned
# hash, the side-by-side benchmark's programs on the CPU, llama.cpp's if
# build/llama-cuda is there, the results .md and .json). Results: build/device-out/.
#   usage: bash scripts/rehearse-device-check.sh [VENV]   (default: $VIRTUAL_ENV or .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:-${VIRTUAL_ENV:-.venv}}
[ -x "$SRC/bin/python" ] || { echo "rehearse-device-check: $SRC is not a virtual environment" >&2; exit 1; }
PYTHON="$SRC/bin/python" bash scripts/fetch-device-wheels.sh
STAND=${STAND:-/tmp/intdet-standin-venv}
rm -rf "$STAND"
cp -a "$SRC" "$STAND"
"$STAND/bin/python" -m pip uninstall -q -y gguf nlohmann-json importlib-resources intdet 2>/dev/null || true
if "$STAND/bin/python" -c "import gguf" 2>/dev/null; then echo "rehearse: gguf still importable" >&2; exit 1; fi
# The GPU image has the build backend (KINDS.md: scikit-build-core, pybind11); a development venv may lack it.
"$STAND/bin/python" -c "import scikit_build_core" 2>/dev/null || "$STAND/bin/python" -m pip install -q "scikit-build-core>=0.9"
STANDIN=1 BUILD_LIMIT=${BUILD_LIMIT:-3000} HC_LIMIT=${HC_LIMIT:-3000} PYTHON="$STAND/bin/python" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  bash scripts/device-check.sh
