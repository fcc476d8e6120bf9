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
# Each wheel's own requirements must be in the image already (checked by
# device-check.sh's install, which uses --no-deps --no-index).
for w in wheels/*.whl; do
  echo "$w: $(unzip -p "$w" '*/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' | cut -d' ' -f2- | tr '\n' ' ')"
done
du -sh wheels
