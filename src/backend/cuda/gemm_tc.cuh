/* gemm_tc.cuh — the tensor-core GEMM of gemm_tc.cu as the rest of the backend calls it (internal):
 * whether it takes a matrix at n tokens, and the call for one or several matrices sharing x, with
 * the optional RMSNorm of x and residual add of the fused ops. */
#ifndef KILN_CUDA_GEMM_TC_CUH
#define KILN_CUDA_GEMM_TC_CUH

#include "backend/cuda/cuda_common.cuh"

/* The kernel takes w at n tokens: on (KILN_CUDA_TC_GEMM, kiln_cuda_set_tc_gemm), MLX affine 4/8-bit
 * codes with group 32/64/128 and n >= 2, or dense bf16 with 2 <= n <= the dense limit (16 unless
 * set); rows and columns that keep 16-byte row starts. */
bool kcu_tc_gemm_applies(const kiln_matrix *w, int64_t n);

/* ys[i][n, ws[i]->rows] (+)= f(x) @ ws[i]^T (+ ws[i]->bias) for count <= 4 matrices of one format
 * (dtype, bits, group, scale dtype) and the same cols; f(x) = rmsnorm(x; norm_w, eps, plus_one)
 * when norm (norm_w NULL: weight 1, as kiln_cpu_rmsnorm), else x; add: the result is added to
 * ys[i]. Returns false (and launches nothing) when the kernel does not take them. */
bool kcu_tc_gemm(kcu_state *st, int count, float *const *ys, const float *x, int64_t n,
                 const kiln_matrix *const *ws, bool norm, const float *norm_w, float eps,
                 bool plus_one, bool add);

#endif
