#!/usr/bin/env bash
# The static checks of the README's test command: ruff (the rules in
# pyproject.toml), mypy on the public API (intdet.api, structured, sampling)
# and no import cycle inside python/intdet. Fails on the first finding.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ruff check python tests scripts examples
python -m mypy python/intdet/api.py python/intdet/structured.py python/intdet/sampling.py
python scripts/check_import_cycles.py python/intdet
