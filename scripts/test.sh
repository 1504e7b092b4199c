#!/usr/bin/env bash
# test.sh — the whole test suite: the Release build's tests, then the same tests under
# AddressSanitizer + UndefinedBehaviorSanitizer. Run scripts/setup.sh first (the README's
# command does both). Set KILN_SKIP_ASAN=1 to run only the Release pass.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

echo "== Release tests =="
ctest --test-dir build --output-on-failure -j"$jobs"

if [ "${KILN_SKIP_ASAN:-0}" != "1" ]; then
  echo "== ASan+UBSan build and tests =="
  bash scripts/setup.sh --asan
  KILN_ASAN=1 ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE slow
fi
