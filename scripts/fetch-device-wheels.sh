#!/usr/bin/env bash
# scripts/fetch-device-wheels.sh: download, on a machine with the package
# registries, every wheel scripts/device-check.sh needs that the GPU image
# lacks, into wheels/ (git-ignored; name it in the device tool's `carry`).
# The image (/work/.library/device/KINDS.md) is Python 3.12 on x86-64 with
# torch, transformers, numpy, click, safetensors, tokenizers, xxhash, jinja2,
# huggingface-hub, pybind11, scikit-build-core, pytest and hypothesis; it
# lacks gguf (a dependency of intdet) and nlohmann-json (a build requirement:
# CMakeLists.txt takes nlohmann/json.hpp from it; it imports importlib-resources,
# also missing there). Versions as pinned below,
# the ones CI builds with; each is pure Python, so one wheel fits any platform.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=(gguf==0.19.0 nlohmann-json==3.12.0 importlib-resources==7.1.0)
mkdir -p wheels
rm -f wheels/*.whl
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform any -d wheels "${WHEELS[@]}"
# --device webgpu (once intdet has it): wgpu and what it needs that the image
# lacks (cffi, pycparser, rendercanvas), into wheels/webgpu/: cffi is built
# for CPython 3.12, so device-check.sh installs these on the GPU machine only.
WEBGPU_WHEELS=(wgpu==0.32.0 cffi==2.1.1 pycparser==3.12 rendercanvas==2.7.2)
mkdir -p wheels/webgpu
rm -f wheels/webgpu/*.whl
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d wheels/webgpu "${WEBGPU_WHEELS[@]}"
# Each wheel's own requirements must be in the image already (checked by
# device-check.sh's install, which uses --no-deps --no-index).
for w in wheels/*.whl wheels/webgpu/*.whl; do
  echo "$w: $(unzip -p "$w" '*/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' | cut -d' ' -f2- | tr '\n' ' ')"
done
du -sh wheels
