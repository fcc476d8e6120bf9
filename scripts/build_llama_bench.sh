#!/usr/bin/env bash
# Build llama.cpp's own llama-bench, llama-quantize and llama-server (CPU only,
# Release) from the llama.cpp vendored in the llama-cpp-python sdist, once;
# later runs reuse them.
#
#   scripts/build_llama_bench.sh [PREFIX]     (default ~/.cache/intdet/llama-bench)
#
# Result: PREFIX/bin/llama-bench, PREFIX/bin/llama-quantize and
# PREFIX/bin/llama-server (other scripts look there). GGML_NATIVE is OFF and the ISA flags are named from
# /proc/cpuinfo: AVX2/FMA/F16C, and the AVX-512 ones when the CPU has them.
# AMX is always OFF: its path dies with SIGILL on the shared VMs (issue 21).
# Environment: LLAMA_CPP_PYTHON_VERSION (default 0.3.36), PYTHON (for pip
# download; default python3), JOBS (default nproc).
set -euo pipefail

PREFIX="${1:-${INTDET_CACHE:-$HOME/.cache/intdet}/llama-bench}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PY="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"

if [[ -x "$PREFIX/bin/llama-bench" && -x "$PREFIX/bin/llama-quantize" && -x "$PREFIX/bin/llama-server" \
      && -f "$PREFIX/bin/VERSION" && "$(cat "$PREFIX/bin/VERSION")" == "$VERSION" ]]; then
  echo "build_llama_bench: reusing $PREFIX/bin (llama-cpp-python $VERSION)" >&2
  exit 0
fi

mkdir -p "$PREFIX/src"
cd "$PREFIX/src"
sdist="llama_cpp_python-$VERSION.tar.gz"
if [[ ! -f "$sdist" ]]; then
  # Only llama-cpp-python itself as an sdist: --no-binary :all: would also build
  # its build backend (scikit-build-core, cmake, ninja) from source, for an hour.
  "$PY" -m pip download "llama-cpp-python==$VERSION" --no-binary llama-cpp-python --no-deps -d . >&2
fi
srcdir="llama_cpp_python-$VERSION"
[[ -d "$srcdir" ]] || tar xzf "$sdist"
llama="$PWD/$srcdir/vendor/llama.cpp"
[[ -f "$llama/CMakeLists.txt" ]] || { echo "build_llama_bench: no vendored llama.cpp in $sdist" >&2; exit 1; }

flag() {  # flag CPUINFO_NAME -> ON/OFF
  if grep -qw "$1" /proc/cpuinfo 2>/dev/null; then echo ON; else echo OFF; fi
}
isa=(
  -DGGML_AVX="$(flag avx)" -DGGML_AVX2="$(flag avx2)" -DGGML_FMA="$(flag fma)" -DGGML_F16C="$(flag f16c)"
  -DGGML_AVX512="$(flag avx512f)" -DGGML_AVX512_VBMI="$(flag avx512vbmi)"
  -DGGML_AVX512_VNNI="$(flag avx512_vnni)" -DGGML_AVX512_BF16="$(flag avx512_bf16)"
  -DGGML_AVX_VNNI="$(flag avx_vnni)" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
)
echo "build_llama_bench: ISA ${isa[*]}" >&2

cmake -S "$llama" -B "$PREFIX/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF "${isa[@]}" \
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_BLAS=OFF \
  -DGGML_OPENMP=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >&2
cmake --build "$PREFIX/build" --target llama-bench llama-quantize llama-server -j "$JOBS" >&2

mkdir -p "$PREFIX/bin"
cp "$PREFIX/build/bin/llama-bench" "$PREFIX/build/bin/llama-quantize" "$PREFIX/build/bin/llama-server" "$PREFIX/bin/"
echo "$VERSION" > "$PREFIX/bin/VERSION"
echo "build_llama_bench: built $PREFIX/bin/llama-bench" >&2
