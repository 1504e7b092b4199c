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
/* The kernel is on and takes w's format (the expert mode's test before its plan) */
bool kcu_tc_format_on(const kiln_matrix *w);

/* ys[i][n, ws[i]->rows] (+)= f(x) @ ws[i]^T (+ ws[i]->bias) for count <= 4 matrices of one format
 * (dtype, bits, group, scale dtype) and the same cols; f(x) = rmsnorm(x; norm_w, eps, plus_one)
 * when norm (norm_w NULL: weight 1, as kiln_cpu_rmsnorm), else x; add: the result is added to
 * ys[i]. Returns false (and launches nothing) when the kernel does not take them. */
bool kcu_tc_gemm(kcu_state *st, int count, float *const *ys, const float *x, int64_t n,
                 const kiln_matrix *const *ws, bool norm, const float *norm_w, float eps,
                 bool plus_one, bool add);

/* Expert mode (the grouped MoE matmul): ys[i] [n, rows] = x_s @ W_i,e(s)^T (+ bias) for n (token,
 * expert) pairs sorted by expert (k_moe_group's list; sorted pair s reads x row list[s] / x_div
 * and writes y row s, or list[s] when scatter), count = 1 or 2 stacks [E * stride, cols] of one
 * format whose expert e has rows e * stride + row_offs[i] + [0, rows), etiles the token tiles of
 * k_moe_group (moe_gather.cuh) for kcu_tc_experts_bytes's max_tiles and tile_tokens. The scratch
 * (its bytes from kcu_tc_experts_bytes: 0 when the kernel does not take the stacks) is the
 * caller's, so that the caller's own arrays (list, tiles) can share kcu_scratch. */
size_t kcu_tc_experts_bytes(int count, const kiln_matrix *const *stacks, int64_t rows, int64_t n,
                            int n_experts, int *max_tiles, int *tile_tokens);
bool kcu_tc_experts(kcu_state *st, int count, float *const *ys, const float *x, int64_t x_div,
                    int64_t n, const kiln_matrix *const *stacks, int64_t rows,
                    const int64_t *row_offs, int64_t stride, const int32_t *list,
                    const int32_t *etiles, bool scatter, void *scratch);

#endif
