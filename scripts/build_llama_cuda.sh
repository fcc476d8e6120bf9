#!/usr/bin/env bash
# scripts/build_llama_cuda.sh: build llama.cpp's own llama-bench and
# llama-batched-bench with the CUDA backend for Hopper (sm_90) on a machine
# WITHOUT a GPU, for scripts/device-check.sh to carry to the lent GPU machine
# (which has no network and no cuBLAS headers to build against).
#
#   bash scripts/build_llama_cuda.sh [DEST]    (default build/llama-cuda, git-ignored)
#
# Source: the llama.cpp vendored in the llama-cpp-python sdist (the version the
# other llama.cpp scripts use). cuBLAS headers and libraries: the nvidia-cublas
# pip wheel (CUDA 13), for linking only; at run time the GPU image's torch
# brings libcublas.so.13 (device-check.sh puts its folder on LD_LIBRARY_PATH).
# nvcc: CUDA 13 on PATH (or NVCC=...).
#
# Choices, and why:
# - CMAKE_CUDA_ARCHITECTURES=90-real: SASS for the H100/H200 only (one arch
#   instead of ggml's eight keeps the build and the carried size small).
# - GGML_NATIVE=OFF with AVX2/FMA/F16C named, AMX OFF (its path dies with
#   SIGILL on the shared VMs, issue 21): the build machine is not the GPU one.
# - GGML_CUDA_NO_VMM=ON: this CUDA has no libcuda.so stub to link against;
#   ggml then uses its plain memory pool.
# - GGML_CUDA_FA_QUANTS=f16-f16: the benchmarks keep the default f16 KV cache.
# - Shared libraries (one copy of ggml-cuda for both programs), stripped,
#   with RUNPATH $ORIGIN so the folder runs from wherever it is carried; no
#   symbolic links (each library once, under its SONAME).
# - OpenMP's libgomp.so.1 is copied beside them (the GPU image need not have it).
# Result: DEST/{llama-bench,llama-batched-bench,lib*.so*} and DEST/VERSION, and
# DEST/convert/: the same source's convert_hf_to_gguf.py, conversion/ and
# gguf-py/ (pure Python), for device-check.sh to write the GGUF on the device.
# Environment: LLAMA_CPP_PYTHON_VERSION (default 0.3.36), PYTHON (for pip
# download), JOBS (default nproc), WORKDIR (sources and build tree; default
# ${XDG_CACHE_HOME:-~/.cache}/intdet/llama-cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=$(realpath -m "${1:-build/llama-cuda}")
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PY="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
WORK="${WORKDIR:-${XDG_CACHE_HOME:-$HOME/.cache}/intdet/llama-cuda}"
TARGETS=(llama-bench llama-batched-bench)

if [[ -f "$DEST/VERSION" && "$(cat "$DEST/VERSION")" == "$VERSION sm_90" && -f "$DEST/convert/convert_hf_to_gguf.py" ]]; then
  echo "build_llama_cuda: reusing $DEST (llama-cpp-python $VERSION)" >&2
  exit 0
fi
command -v "${NVCC:-nvcc}" >/dev/null || { echo "build_llama_cuda: no nvcc on PATH (set NVCC)" >&2; exit 1; }
NVCC=$(command -v "${NVCC:-nvcc}")

mkdir -p "$WORK"
cd "$WORK"
sdist="llama_cpp_python-$VERSION.tar.gz"
[[ -f "$sdist" ]] || "$PY" -m pip download -q "llama-cpp-python==$VERSION" --no-binary llama-cpp-python --no-deps -d .
srcdir="llama_cpp_python-$VERSION"
[[ -d "$srcdir" ]] || tar xzf "$sdist"
llama="$PWD/$srcdir/vendor/llama.cpp"
[[ -f "$llama/CMakeLists.txt" ]] || { echo "build_llama_cuda: no vendored llama.cpp in $sdist" >&2; exit 1; }

# cuBLAS for linking: the CUDA 13 wheel, unpacked (no install into any environment).
if ! compgen -G "cublas/nvidia/cu13/lib/libcublas.so.13" >/dev/null; then
  rm -rf cublas cublas-whl
  "$PY" -m pip download -q --no-deps --only-binary=:all: "nvidia-cublas>=13,<14" -d cublas-whl
  mkdir cublas
  (cd cublas && unzip -q ../cublas-whl/nvidia_cublas-*.whl 'nvidia/*')
  rm -rf cublas-whl
fi
CUBLAS="$PWD/cublas/nvidia/cu13"
[[ -f "$CUBLAS/include/cublas_v2.h" ]] || { echo "build_llama_cuda: no cublas_v2.h in $CUBLAS" >&2; exit 1; }

BUILD="$WORK/build-$VERSION"
cmake -S "$llama" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES=90-real \
  -DCUDA_cublas_LIBRARY="$CUBLAS/lib/libcublas.so.13" -DCUDA_cublasLt_LIBRARY="$CUBLAS/lib/libcublasLt.so.13" \
  -DCMAKE_CUDA_FLAGS="-isystem $CUBLAS/include" -DCMAKE_CXX_FLAGS="-isystem $CUBLAS/include" \
  -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath-link,$CUBLAS/lib" -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$CUBLAS/lib" \
  -DCMAKE_BUILD_RPATH='$ORIGIN' -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
  -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DGGML_CUDA=ON -DGGML_CUDA_NO_VMM=ON -DGGML_CUDA_GRAPHS=ON -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_FA=ON \
  -DGGML_CUDA_FA_QUANTS=f16-f16 \
  -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >&2
cmake --build "$BUILD" --target "${TARGETS[@]}" -j "$JOBS" >&2

rm -rf "$DEST.partial"
mkdir -p "$DEST.partial"
for t in "${TARGETS[@]}"; do cp "$BUILD/bin/$t" "$DEST.partial/"; done
# The shared libraries the programs load from the build tree (not cuBLAS/cudart: the GPU image has them),
# as plain files under the names the loader asks for (the SONAMEs lib*.so.0 and the unversioned
# lib*-impl.so): no symbolic links, which the device tool carries only as links.
for f in "$BUILD"/bin/lib*.so.[0-9] "$BUILD"/bin/lib*.so; do
  if [[ ! -L "$f" || "$f" == *.so.[0-9] ]]; then cp -L "$f" "$DEST.partial/"; fi
done
gomp=$(${CXX:-c++} -print-file-name=libgomp.so.1)
[[ -f "$gomp" ]] && cp -L "$gomp" "$DEST.partial/libgomp.so.1"
strip --strip-unneeded "$DEST.partial"/*
missing=$(cd "$DEST.partial" && for f in llama-* lib*.so*; do LD_LIBRARY_PATH=. ldd "$f"; done | grep 'not found' | grep -v -e libcublas -e libcudart | sort -u || true)
[[ -z "$missing" ]] || { echo "build_llama_cuda: libraries not found beside the programs: $missing" >&2; exit 1; }
mkdir "$DEST.partial/convert"
cp -r "$llama/convert_hf_to_gguf.py" "$llama/conversion" "$llama/gguf-py" "$DEST.partial/convert/"
find "$DEST.partial/convert" -name __pycache__ -prune -exec rm -rf {} +
echo "$VERSION sm_90" >"$DEST.partial/VERSION"
rm -rf "$DEST"
mv "$DEST.partial" "$DEST"  # whole or not at all
du -sh "$DEST" >&2
echo "build_llama_cuda: built $DEST" >&2
