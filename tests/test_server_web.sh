#!/usr/bin/env bash
# test_server_web.sh — the embedded chat page: src/server/web_page.c matches web/index.html, and
# a click-and-reply round trip in headless Chromium (tests/server/web.mjs, playwright-core).
# Installs Debian's chromium with apt-get when missing; skips (77) only when neither it nor npm
# packages can be had.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp)"; trap 'rm -f "$tmp"' EXIT
bash "$root/scripts/embed_web.sh" "$tmp"
cmp -s "$tmp" "$root/src/server/web_page.c" || { echo "src/server/web_page.c is stale: run scripts/embed_web.sh"; exit 1; }
echo "ok   web_page.c matches web/index.html"
command -v node >/dev/null && command -v npm >/dev/null || { echo "node/npm not found: skipping"; exit 77; }
[ -x "${KILN_BIN:-}" ] || { echo "KILN_BIN not set"; exit 1; }
"$KILN_BIN" serve --help >/dev/null 2>&1 || { echo "kiln built without the server: skipping"; exit 77; }
if [ ! -x /usr/bin/chromium ]; then
  (apt-get install -y chromium >/dev/null 2>&1 || (apt-get update >/dev/null 2>&1 && apt-get install -y chromium >/dev/null 2>&1)) || true
  [ -x /usr/bin/chromium ] || { echo "chromium not installable: skipping"; exit 77; }
fi
export KILN_NPM="${KILN_BUILD:-$root/build-server}/server-npm"
mkdir -p "$KILN_NPM"
if ! cmp -s "$root/tests/server/package.json" "$KILN_NPM/package.json" || [ ! -d "$KILN_NPM/node_modules/playwright-core" ]; then
  cp "$root/tests/server/package.json" "$KILN_NPM/package.json"
  (cd "$KILN_NPM" && timeout 300 npm install --no-audit --no-fund --loglevel=error) || { npm ping >/dev/null 2>&1 || { echo "npm unreachable: skipping"; exit 77; }; exit 1; }
fi
cd "$root/tests/server"
exec timeout 600 node web.mjs
