#!/usr/bin/env bash
# scripts/fetch_llamacpp_convert.sh: llama.cpp's own HF -> GGUF converter
# (convert_hf_to_gguf.py, its conversion/ package and gguf-py), taken from the
# llama.cpp vendored in the llama-cpp-python sdist, for the family tests'
# GGUF oracle (tests/llamacpp_convert.py). Pure Python: it needs torch,
# transformers and numpy, already in the test extra. Prints the folder.
#   usage: bash scripts/fetch_llamacpp_convert.sh [DEST]
#   (default ${XDG_CACHE_HOME:-~/.cache}/intdet/llama.cpp-convert-<version>)
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PY=${PYTHON:-python3}
DEST=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/intdet/llama.cpp-convert-$VERSION}
if [ -f "$DEST/convert_hf_to_gguf.py" ] && [ -d "$DEST/conversion" ] && [ -d "$DEST/gguf-py/gguf" ]; then
  echo "$DEST"
  exit 0
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download -q "llama-cpp-python==$VERSION" --no-binary llama-cpp-python --no-deps -d "$TMP" >&2
SRC="llama_cpp_python-$VERSION/vendor/llama.cpp"
tar xzf "$TMP"/llama_cpp_python-*.tar.gz -C "$TMP" "$SRC/convert_hf_to_gguf.py" "$SRC/conversion" "$SRC/gguf-py"
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST.partial"
mv "$TMP/$SRC" "$DEST.partial"
rm -rf "$DEST"
mv "$DEST.partial" "$DEST"  # whole or not at all
echo "$DEST"
