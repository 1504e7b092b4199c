#!/usr/bin/env bash
# gpu_deps.sh — prepares .deps/root: the Debian -dev packages libkiln links against (cJSON, PCRE2,
# utf8proc), unpacked with dpkg -x so they can be carried to the GPU machine (which has no
# registry access and none of these packages). Run here, then pass carry: [".deps"] to the device
# call and configure there with -DKILN_DEPS_PREFIX=$PWD/.deps/root (see docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
cd .deps
rm -rf root ./*.deb
apt-get download libcjson-dev libcjson1 libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2
for f in ./*.deb; do dpkg -x "$f" root; done
# Point the .pc files at wherever root ends up: pkg-config's ${pcfiledir} keeps them relocatable.
for pc in root/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do
    sed -i -E 's#^(prefix|exec_prefix|libdir|includedir)=/usr#\1=${pcfiledir}/../../..#' "$pc"
done
du -sh root
