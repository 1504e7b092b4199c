#!/usr/bin/env bash
# test_server_load.sh — 64 concurrent streaming clients + a disconnect soak (tests/server/load.mjs).
# KILN_LOAD_CLIENTS / KILN_LOAD_SECONDS override the defaults (64, 20).
set -euo pipefail
command -v node >/dev/null || { echo "node not found: skipping"; exit 77; }
[ -x "${KILN_BIN:-}" ] || { echo "KILN_BIN not set"; exit 1; }
"$KILN_BIN" serve --help >/dev/null 2>&1 || { echo "kiln built without the server: skipping"; exit 77; }
cd "$(dirname "$0")/server"
exec timeout 600 node load.mjs
