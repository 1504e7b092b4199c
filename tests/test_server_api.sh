#!/usr/bin/env bash
# test_server_api.sh — kiln serve over HTTP: bad-input table, chat/completions behaviour, prefix
# reuse and batching correctness (tests/server/api.mjs). Needs node; no npm packages.
set -euo pipefail
command -v node >/dev/null || { echo "node not found: skipping"; exit 77; }
[ -x "${KILN_BIN:-}" ] || { echo "KILN_BIN not set"; exit 1; }
"$KILN_BIN" serve --help >/dev/null 2>&1 || { echo "kiln built without the server: skipping"; exit 77; }
cd "$(dirname "$0")/server"
exec timeout 600 node api.mjs
