/* cuda_ops.h — the launchers each kernel file of the CUDA backend exports to cuda_backend.cu
 * (internal; the public entry point is kiln_backend_cuda_new in backend/backend.h). All pointers
 * are device pointers; every launcher enqueues on the backend's stream and returns at once. */
#ifndef KILN_CUDA_OPS_H
#define KILN_CUDA_OPS_H

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"

void kcu_matmul(kiln_backend *be, float *y, const float *x, int64_t n, const kiln_matrix *w);
void kcu_embed(kiln_backend *be, float *out, const int32_t *ids, int64_t n, const kiln_matrix *w);
void kcu_rmsnorm(kiln_backend *be, float *y, const float *x, const float *w, int64_t n, int64_t dim,
                 float eps, bool plus_one);
void kcu_matmul_multi(kiln_backend *be, int count, float *const *ys, const float *x, int64_t n,
                      const kiln_matrix *const *ws);
void kcu_matmul_norm(kiln_backend *be, int count, float *const *ys, const float *x, float *h,
                     int64_t n, const kiln_matrix *const *ws, const float *norm_w, float eps,
                     bool plus_one);
void kcu_matmul_add(kiln_backend *be, float *y, const float *x, float *tmp, int64_t n,
                    const kiln_matrix *w);
void kcu_prefetch(kiln_backend *be, const kiln_matrix *const *ws, int count);
void kcu_feeds_next(kiln_backend *be, const float *x, const float *norm_w, float eps,
                    bool plus_one);
void kcu_matmul_norm_glu(kiln_backend *be, float *out, const float *x, float *h, float *up,
                         int64_t n, const kiln_matrix *wg, const kiln_matrix *wu,
                         const float *norm_w, float eps, bool plus_one, kiln_glu_act act);
void kcu_add_rmsnorm(kiln_backend *be, float *x, const float *h, float *y, const float *w,
                     int64_t n, int64_t dim, float eps, bool plus_one);
void kcu_norm_add(kiln_backend *be, float *x, float *h, const float *w, int64_t n, int64_t dim,
                  float eps, bool plus_one, float scale);
void kcu_qk_norm_rope(kiln_backend *be, float *q, float *k, const int32_t *pos, int64_t n,
                      int n_heads, int n_kv_heads, int head_dim, int rot_dim, const float *inv_freq,
                      const float *q_norm, const float *k_norm, float eps);
void kcu_rope(kiln_backend *be, float *x, const int32_t *pos, int64_t n, int n_heads, int head_dim,
              int rot_dim, const float *inv_freq);
void kcu_silu_mul(kiln_backend *be, float *y, const float *gate, const float *up, int64_t n);
void kcu_gelu_tanh_mul(kiln_backend *be, float *y, const float *gate, const float *up, int64_t n);
void kcu_add(kiln_backend *be, float *y, const float *a, const float *b, int64_t n);
void kcu_scale(kiln_backend *be, float *x, float s, int64_t n);
void kcu_softcap(kiln_backend *be, float *x, float cap, int64_t n);
void kcu_copy2d(kiln_backend *be, float *dst, int64_t dst_stride, const float *src,
                int64_t src_stride, int64_t rows, int64_t cols);
void kcu_copy3d(kiln_backend *be, float *dst, int64_t dst_s0, int64_t dst_s1, const float *src,
                int64_t src_s0, int64_t src_s1, int64_t n0, int64_t n1, int64_t cols);
void kcu_zero(kiln_backend *be, float *x, int64_t n);
void kcu_sigmoid_mul(kiln_backend *be, float *y, const float *x, const float *gate, int64_t n);
void kcu_l2norm(kiln_backend *be, float *x, int64_t rows, int dim, float eps);
void kcu_gdn_split_qkv(kiln_backend *be, float *q, float *k, float *v, const float *conv, int64_t n,
                       int64_t C, int nk, int dk, int64_t vd, float eps);
void kcu_gated_rmsnorm(kiln_backend *be, float *y, const float *x, const float *z, const float *w,
                       int64_t rows, int dim, float eps);
void kcu_gdn_conv(kiln_backend *be, float *out, const float *x, int n_seqs, const int *n_tokens,
                  int channels, const float *w, int kernel, float *const *states);
void kcu_gdn_gates(kiln_backend *be, float *g, float *beta, const float *a, const float *b,
                   int64_t n, int n_v_heads, const float *neg_a, const float *dt_bias);
void kcu_gdn_delta(kiln_backend *be, const kiln_gdn_dims *d, int n_seqs, const int *n_tokens,
                   const float *q, const float *k, const float *v, const float *g,
                   const float *beta, float *const *states, float *out);
/* The chunked form (gdn_chunked.cu) for one sequence of n tokens when it applies (enough tokens,
 * dk 32/64/128/256, dv <= 256); false: nothing was launched, the caller runs the recurrence. */
bool kcu_gdn_delta_chunked(kiln_backend *be, const kiln_gdn_dims *d, int64_t n, const float *q,
                           const float *k, const float *v, const float *g, const float *beta,
                           float *state, float *out);
void kcu_gather_rows(kiln_backend *be, float *dst, const float *src, const int32_t *rows, int64_t n,
                     int64_t width);
void kcu_scatter_add_rows(kiln_backend *be, float *y, const float *src, const int32_t *rows,
                          const float *weights, int64_t n, int64_t width);
/* moe.cu: the MoE block's device routing (backend.h moe_route, matmul_gather, matmul_gather_glu,
 * moe_combine) */
void kcu_moe_route(kiln_backend *be, int32_t *experts, float *weights, const float *logits,
                   int64_t T, int n_experts, int top_k, bool norm_topk, const float *expert_scale);
void kcu_matmul_gather(kiln_backend *be, float *y, const float *x, int64_t x_div, int64_t n,
                       const int32_t *experts, const kiln_matrix *w, int64_t rows);
void kcu_matmul_gather_glu(kiln_backend *be, float *y, const float *x, int64_t x_div, int64_t n,
                           const int32_t *experts, const kiln_matrix *gate, const kiln_matrix *up,
                           int64_t rows, int64_t stride, int64_t up_offset, kiln_glu_act act);
void kcu_moe_combine(kiln_backend *be, float *y, const float *ye, const float *weights, int64_t T,
                     int top_k, int64_t hidden, const float *shared, const float *shared_logit);
bool kcu_moe_gather_grouped(const kiln_backend *be, const kiln_matrix *w, int64_t pairs);
/* sampling.cu: the `sample` op (rows and history are host memory; see backend.h) */
void kcu_sample(kiln_backend *be, int32_t *ids, float *logits, int64_t vocab, int n_rows,
                const kiln_sample_row *rows, const int32_t *history);
kiln_status kcu_kv_new(kiln_backend *be, const kiln_kv_layer_desc *layers, int n_layers,
                       const kiln_kv_options *opts, int max_tokens, kiln_kv **out);
/* Kernels of the paged caches whose pool is in device memory (kv_paged.cu). */
struct kv_device_ops;
extern const struct kv_device_ops kcu_kv_paged_ops;

/* Number of CUDA devices (0 when none); on 0 writes the reason into why. For tests and `kiln`. */
int kiln_cuda_device_count(char *why, size_t why_len);
/* Forces the matmul path for benchmarks and tests: 0 auto, 1 GEMV kernel, 2 GEMM (cuBLAS). */
void kiln_cuda_force_matmul_path(int path);
/* Quantized GEMV kernel (n <= 8): 1 = block of 4 warps splitting the columns of 4 rows, 2 = each
 * warp owns rows_per_warp (1, 2, 4; 0 = by shape) whole rows, 3 = the dp4a kernel (qgemv.cu) for
 * 4/8-bit codes (others: as 0), 0 = auto (3 for 4/8 bits, else 2 or 1 by shape). Default: env
 * KILN_CUDA_QGEMV (and KILN_CUDA_QGEMV_R); variant < 0 goes back to the environment. */
void kiln_cuda_set_qgemv_variant(int variant, int rows_per_warp);
/* The dp4a kernel's shape: rows per warp (1, 2, 4; 0 = by n), warps splitting a row's columns
 * (1, 2, 4, 8; 0 = by shape) and, on Hopper, programmatic dependent launch of its second kernel
 * (1 = on, 0 = off). A value < 0 comes from env KILN_CUDA_QGEMV_ROWS / _KS / _PDL (default 0, 0,
 * 1). */
void kiln_cuda_set_qgemv_dp4a(int rows_per_warp, int split, int pdl);
/* Whether the dp4a kernel's blocks make x's digits themselves at n = 1 (no pass-1 launch): 0 =
 * never, 1 = wherever x fits in shared memory, 2 = where the grid's repeated digit work is small
 * (default; env KILN_CUDA_QGEMV_INLINE_COLS columns per SM, 6144); -1 goes back to env
 * KILN_CUDA_QGEMV_INLINE. Off with KILN_CUDA_FUSED=0. */
void kiln_cuda_set_qgemv_inline(int mode);
/* x's digits handed from one quantized GEMV to the next where the model hints it (feeds_next,
 * qgemv.cu qg_link): 1 on, the blocks of a 32-row group meeting through global atomics; 2 on,
 * those blocks launched as a cluster that meets in distributed shared memory (sm_90); 0 off
 * (default: 1 measured level to +3%); < 0 back to env KILN_CUDA_QGEMV_LINK. */
void kiln_cuda_set_qgemv_link(int mode);
/* How many GEMVs of any backend of the process so far read x's digits handed on instead of
 * running pass 1 (tests; counted when the host runs the op: a decode step replayed from a graph
 * adds nothing). */
long long kiln_cuda_qgemv_links_total(void);
/* How many GEMV launches so far emitted x's digits with their blocks meeting as clusters
 * (KILN_CUDA_QGEMV_LINK=2; counted as kiln_cuda_qgemv_links_total). */
long long kiln_cuda_qgemv_cluster_launches_total(void);
/* Whether the current device runs that mode in clusters (compute capability 9.x); elsewhere
 * mode 2 meets as mode 1 does. */
int kiln_cuda_qgemv_clusters_supported(void);
/* The quantized decode GEMV at n = 1 on int8 tensor cores (qgemv.cu, k_qgemv_mma): 1 on, 0 off
 * (default); -1 goes back to env KILN_CUDA_QGEMV_MMA. */
void kiln_cuda_set_qgemv_mma(int on);
/* The quantized (dp4a) decode fusions: 1 on, 0 off, < 0 back to KILN_CUDA_QFUSED (default on;
 * see kcu_qfused_enabled in gemv.cuh). */
void kiln_cuda_set_qfused(int on);
/* Decode attention with the q/k norm + RoPE and the KV store inside (attention.cu's PREP kernel,
 * the contiguous device cache): 1 always, 0 never (default: the q/k prep + store launch, then
 * the attention), 2 for steps of >= 32 sequences, < 0 back to env KILN_CUDA_ATT_PREP. */
void kiln_cuda_set_attn_prep(int on);
/* Decode steps with the q/k prep that the PREP kernel does not take: 1 (default) q/k norm + RoPE
 * and the K/V store as one launch (kv_cache.cu) before the attention, 0 qk_norm_rope and the
 * store apart; < 0 back to env KILN_CUDA_QK_STORE. */
void kiln_cuda_set_qk_store(int on);
/* Decode attention with one block per (KV head, sequence) and the keys split among its warps
 * (attention.cu, k_attn_decode_short) up to max_keys keys (bucketed); 0 = never (the split kernel
 * and its merge), < 0 = env KILN_CUDA_ATT_SHORT (default 512). */
void kiln_cuda_set_attn_short(int max_keys);
/* bf16 GEMV kernel (n <= 8): 1 = 4 warps split the columns of 4 rows (default), 2 = row-streaming
 * kernel with split warps per row (1, 2, 4, 8; 0 = by shape). Default: env KILN_CUDA_GEMV_DENSE
 * and KILN_CUDA_GEMV_DENSE_KS; variant < 0 goes back to the environment. */
void kiln_cuda_set_gemv_dense_variant(int variant, int split);
/* Tensor-core GEMM (gemm_tc.cu) for 4/8-bit MLX weights at n >= 2 and bf16 weights at 2 <= n <=
 * dense_max_n: mode 0 = off (GEMV / dp4a / cuBLAS as before), 1 = on (default), 2 = forced for
 * every n and every bf16 n (tests, bench); bn = tokens per block (8, 16, 64, 128; 0 = by n);
 * splits = split-K count (0 = by shape). A value < 0 (mode, dense_max_n) comes from env
 * KILN_CUDA_TC_GEMM / KILN_CUDA_TC_DENSE_MAX_N (defaults 1, 16). */
void kiln_cuda_set_tc_gemm(int mode, int dense_max_n, int bn, int splits);
/* The tensor-core GEMM's int8 variant for 4/8-bit weights (gemm_tc_int8.cuh: x as signed-byte
 * digits, mma m16n8k32 on the codes): 1 = on, 0 = off (default), < 0 = env KILN_CUDA_TC_INT8. */
void kiln_cuda_set_tc_int8(int on);
/* Fast mode's tensor-core GEMM on 4/8-bit codes: 1 = W dequantized in registers (scale q + bias
 * as f16, default), 0 = codes against x with the scales folded in per group; < 0 = env
 * KILN_CUDA_TC_DQ. */
void kiln_cuda_set_tc_dq(int on);
/* The tensor-core GEMM's split-K sum: 1 = by the last split inside the kernel (tc_reduce_last),
 * 0 = a k_tc_reduce launch (default), < 0 = env KILN_CUDA_TC_REDUCE. */
void kiln_cuda_set_tc_reduce(int in_kernel);
/* The MoE gather's grouped form (moe.cu): 1 always, 0 never, -1 auto (more pairs than half the
 * experts), -2 back to KILN_CUDA_MOE_GROUPED. */
void kiln_cuda_set_moe_grouped(int mode);
/* The MoE gathers on the tensor-core expert GEMM (moe.cu, gemm_tc.cu expert mode): 1 always
 * where the format allows, 0 never, -1 auto (from 16 pairs), -2 back to KILN_CUDA_MOE_TC. */
void kiln_cuda_set_moe_tc(int mode);
/* The prefetch hint's budget in MB (prefetch.cu; 0 = off, the default); < 0 = env
 * KILN_CUDA_PREFETCH_MB. */
void kiln_cuda_set_prefetch_mb(int mb);
/* Prefetch kernels launched so far (tests check the hint ran). */
long long kiln_cuda_prefetch_launches(void);
/* Tensor-core GEMM calls so far (every backend of the process): tests check the path ran. */
long long kiln_cuda_tc_gemm_launches(void);
/* cuBLAS path for 16-bit/quantized weights: x as bf16 (0, fast) or as a bf16 hi+lo pair through
 * two GEMMs (1, x kept to ~2^-17). Default: env KILN_CUDA_GEMM=split|bf16. */
void kiln_cuda_set_gemm_split(int on);
/* Quantized weights at n >= these many tokens are dequantized slice by slice to bf16 (a hi + lo
 * pair in exact mode) for cuBLAS instead of taking the tensor-core GEMM; < 0 = env
 * KILN_CUDA_DEQUANT_MIN_N / KILN_CUDA_DEQUANT_MIN_N_FAST (defaults 128 / 32). */
void kiln_cuda_set_dequant_min_n(int exact, int fast);
/* Decode-step graphs of backends created from now on: -1 = env KILN_CUDA_GRAPH (default on),
 * 0 = off (every op launched), 1 = on. For tests comparing the two paths. */
void kiln_cuda_set_graph_mode(int mode);
/* Programmatic dependent launches for backends created afterwards: 1 on, 0 off, -1 back to the
 * default (on for compute capability 9.x unless KILN_CUDA_PDL=0). For tests. */
void kiln_cuda_set_pdl_mode(int mode);
/* Decode steps replayed from a kept graph, summed over every CUDA backend of the process. */
long long kiln_cuda_graph_replays(void);
/* gdn_delta kernel: 1 forces the simple one (a thread per value column, S in global memory), 0
 * the register-resident one where dk allows (dk = 16, 32, 64, 128). Default: env KILN_CUDA_GDN (2:
 * the register kernel, not yet run on a GPU; otherwise the simple one). */
void kiln_cuda_set_gdn_simple(int on);
/* gdn_delta calls of at least min_tokens tokens take the chunked kernels (gdn_chunked.cu): 0 =
 * never, 1 = every call (tests), -1 = back to env KILN_CUDA_GDN_CHUNK (0 off, N = at least N
 * tokens; default 64). max_seg_chunks > 0 caps the chunks of 64 tokens per pair of launches (tests
 * of the segment loop); 0 = as many as the scratch budget allows. */
void kiln_cuda_set_gdn_chunk(int min_tokens, int max_seg_chunks);
/* Prefill attention on tensor cores (attention_prefill_tc.cu): 0 = off (the CUDA-core kernel),
 * 1 = sequences of >= 64 tokens with an f16/bf16 cache and head dim 64/80/96/128/256, 2 = every
 * such sequence whatever its length (tests); -1 goes back to env KILN_CUDA_FA (default 1). */
void kiln_cuda_set_fa_mode(int mode);
/* Which tensor-core prefill kernel: 0 = the pipelined one (cp.async double buffer, ldmatrix
 * fragments; default), 1 = the simple one (one stage staged through registers, 32-bit fragment
 * loads); -1 goes back to env KILN_CUDA_FA_SIMPLE (default 0). */
void kiln_cuda_set_fa_simple(int simple);
/* f32 device caches on the tensor-core prefill kernel too (the simple kernel): 2 = K/V, Q and P as
 * bf16 hi + lo pairs, three products per MMA (~2^-16 relative; default in exact mode), 1 = K/V
 * rounded to bf16 as tiles are staged (default in fast mode), 0 = off (the CUDA-core kernel, f32);
 * -1 goes back to env KILN_CUDA_FA_F32 (else the default by mode). */
void kiln_cuda_set_fa_f32(int on);
/* Tensor-core prefill attention launches so far (every backend of the process): tests check that
 * the path really ran. */
long long kiln_cuda_fa_launches(void);
/* The backend's cudaStream_t (as void *): for timing with events in benchmarks. */
void *kiln_cuda_stream(kiln_backend *be);

#ifdef __cplusplus
}
#endif
#endif
