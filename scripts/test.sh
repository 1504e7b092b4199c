#!/usr/bin/env bash
# test.sh — the whole test suite: the Release build's tests, then the same tests under
# AddressSanitizer + UndefinedBehaviorSanitizer. Run scripts/setup.sh first (the README's
# command does both). Set KILN_SKIP_ASAN=1 to run only the Release pass.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

# The parity tests read the team's data (fixtures, tokenizers, models): say so once, clearly,
# instead of a dozen failing tests, when it is not where the build looks for it.
shared=$(sed -n 's/^KILN_SHARED_DIR:PATH=//p' build/CMakeCache.txt 2>/dev/null || true)
if [ -z "$shared" ] || [ ! -d "$shared/fixtures" ]; then
  echo "test: the team's shared/ folder is missing (looked for ${shared:-../shared}/fixtures)." >&2
  echo "test: put it beside the repository as ../shared, or run with KILN_SHARED=/path/to/shared" >&2
  echo "test: (scripts/setup.sh then records it in the build)." >&2
  exit 1
fi

echo "== Release tests =="
ctest --test-dir build --output-on-failure -j"$jobs"

if [ "${KILN_SKIP_ASAN:-0}" != "1" ]; then
  echo "== ASan+UBSan build and tests =="
  bash scripts/setup.sh --asan
  KILN_ASAN=1 ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE slow
fi
