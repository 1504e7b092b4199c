#!/usr/bin/env bash
# test_server_clients.sh — the official `openai` and `@anthropic-ai/sdk` npm packages against
# kiln serve (tests/server/clients.mjs). Packages are installed with npm into
# $KILN_BUILD/server-npm (gitignored); skipped (77) only when npm cannot reach the registry.
set -euo pipefail
command -v node >/dev/null && command -v npm >/dev/null || { echo "node/npm not found: skipping"; exit 77; }
[ -x "${KILN_BIN:-}" ] || { echo "KILN_BIN not set"; exit 1; }
"$KILN_BIN" serve --help >/dev/null 2>&1 || { echo "kiln built without the server: skipping"; exit 77; }
src="$(cd "$(dirname "$0")" && pwd)/server"
export KILN_NPM="${KILN_BUILD:-$src/../../build-server}/server-npm"
mkdir -p "$KILN_NPM"
if ! cmp -s "$src/package.json" "$KILN_NPM/package.json" || [ ! -d "$KILN_NPM/node_modules/openai" ]; then
  cp "$src/package.json" "$KILN_NPM/package.json"
  if ! (cd "$KILN_NPM" && timeout 300 npm install --no-audit --no-fund --loglevel=error); then
    npm ping >/dev/null 2>&1 || { echo "npm registry unreachable: skipping"; exit 77; }
    echo "npm install failed"; exit 1
  fi
fi
cd "$src"
exec timeout 600 node clients.mjs
