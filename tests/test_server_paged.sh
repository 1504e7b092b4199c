#!/usr/bin/env bash
# test_server_paged.sh — the server API test (test_server_api.sh) again with the paged KV pool
# (--kv q8 --kv-block 16): prefix reuse through the pool's prefix cache, admission by free blocks.
set -euo pipefail
export KILN_SERVE_EXTRA="${KILN_SERVE_EXTRA:---kv q8 --kv-block 16}"
exec bash "$(dirname "$0")/test_server_api.sh"
