#!/usr/bin/env bash
# Fuzz intdet's model-file readers for longer than the test suite does.
#
#   scripts/fuzz.sh [SECONDS] [gguf|safetensors|all] [extra harness options...]
#
# SECONDS (default $INTDET_FUZZ_SECONDS or 600) is per fuzzer; both fuzzers
# run in parallel. Needs atheris (pip install atheris); without it the
# harness falls back to a plain random-mutation loop (--engine plain).
# Crashing inputs land in fuzz-artifacts/ (or --artifacts DIR); replay one
# with: python tests/fuzz/fuzz_gguf.py fuzz-artifacts/crash-gguf-...
# and turn it into a case of tests/convert/test_crafted_files.py once fixed.
set -u
cd "$(dirname "$0")/.."
secs="${1:-${INTDET_FUZZ_SECONDS:-600}}"
which="${2:-all}"
shift $(( $# > 2 ? 2 : $# ))
case "$which" in
  all) targets="gguf safetensors" ;;
  gguf|safetensors) targets="$which" ;;
  *) echo "usage: $0 [SECONDS] [gguf|safetensors|all] [options]" >&2; exit 2 ;;
esac
mkdir -p fuzz-artifacts
pids=()
for t in $targets; do
  python tests/fuzz/fuzz_"$t".py --seconds "$secs" --artifacts fuzz-artifacts "$@" > "fuzz-artifacts/$t.log" 2>&1 &
  pids+=("$!")
  echo "fuzz $t: pid $!, log fuzz-artifacts/$t.log"
done
status=0
i=0
for t in $targets; do
  if wait "${pids[$i]}"; then
    echo "fuzz $t: OK ($(grep -E '^(Done|fuzz: OK)' "fuzz-artifacts/$t.log" | tail -1))"
  else
    status=1
    echo "fuzz $t: CRASH, see fuzz-artifacts/$t.log:"
    grep -A20 -E "Uncaught Python exception|ERROR: libFuzzer|fuzz: CRASH" "fuzz-artifacts/$t.log" | head -40
  fi
  i=$((i + 1))
done
exit $status
