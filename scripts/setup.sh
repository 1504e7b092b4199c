#!/usr/bin/env bash
# setup.sh — installs kiln's build and test dependencies from Debian's apt (and Node.js 20 from
# the npm registry when the system's is older), then builds kiln in build/ (Release).
# Usage: bash scripts/setup.sh [--asan]   (as root on Debian 12; sudo is used when not root)
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

packages=(build-essential cmake pkg-config git ca-certificates curl
          libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev
          clang clang-format python3 python3-numpy)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm may come from elsewhere (e.g. a vendor's nodejs that bundles npm): only ask
# apt for them when the commands are missing.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Tests that run Hugging Face's tokenizers through its Node binding need Node.js >= 20.
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$node_major" -lt 20 ]; then
  echo "setup: Node.js $node_major is too old for the test tools; installing node@20 from npm"
  $SUDO npm install -g --silent node@20 >/dev/null
  hash -r
fi

build_dir=build
cmake_args=(-DCMAKE_BUILD_TYPE=Release)
if [ "${1:-}" = "--asan" ]; then
  build_dir=build-asan
  cmake_args=(-DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON -DKILN_CUDA=OFF)
fi
# the team's data folder the tests read: ../shared beside the repository, or $KILN_SHARED
if [ -n "${KILN_SHARED:-}" ]; then cmake_args+=(-DKILN_SHARED_DIR="$KILN_SHARED"); fi
cmake -S . -B "$build_dir" "${cmake_args[@]}" >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
echo "setup: built $build_dir/kiln"
