#!/usr/bin/env bash
# session26_run.sh — the twenty-sixth session's check call: the flash-attention tile loop shared by
# the contiguous and paged kernels (attention_tile.cuh, written after the session's H100 calls)
# and q/k/v, gate/up uploaded as one allocation by default (KILN_CUDA_FUSE_WEIGHTS=0 the old way)
# through the attention and layer-fusion op tests (their checks now one helper), the paged-cache
# tests and the parity tests; tests only.
LIMIT=${LIMIT:-280}
source "$(dirname "$0")/common.sh"
exec > >(tee "${OUT:-/tmp}/log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
build_minimal test_cuda_ops test_parity_cuda test_parity_cuda_gemma test_kv_cuda test_parity_cuda_kv
stamp "tests"
ONLY=test_attention,test_upload_matrices,test_tc_fused,test_matmul_fused
TEST_TIMEOUT=120 run_tests "test_cuda_ops KILN_TEST_ONLY=$ONLY" test_parity_cuda \
    "test_parity_cuda KILN_CUDA_FUSE_WEIGHTS=0" test_parity_cuda_gemma test_kv_cuda test_parity_cuda_kv
stamp "end"
