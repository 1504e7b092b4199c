/* attention.cuh — the attention launcher shared by the device KV caches (internal). */
#ifndef KILN_CUDA_ATTENTION_CUH
#define KILN_CUDA_ATTENTION_CUH

/* tests/emu/attention_emulate.cc (KCU_HOST_EMU): the argument types only, its own helpers */
#ifndef KCU_HOST_EMU
#include "backend/cuda/cuda_common.cuh"

/* Element i of a KV buffer of dtype dt (F32, F16 or BF16) set to x, rounded to nearest even. */
__device__ __forceinline__ void kcu_kv_put(void *dst, int64_t i, float x, int dt) {
    if (dt == KILN_DT_F32)
        ((float *)dst)[i] = x;
    else if (dt == KILN_DT_F16)
        ((__half *)dst)[i] = __float2half_rn(x);
    else
        ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(x);
}
#endif

typedef struct kcu_attn_args {
    const float *q; /* [n, n_heads*head_dim], queries at positions pos0..pos0+n-1 */
    float *out;     /* [n, n_heads*v_head_dim] */
    int n, pos0;
    const void *k, *v; /* [>= pos0+n, n_kv_heads*head_dim | *v_head_dim], key i at position i */
    int kv_dtype;      /* F32, F16 or BF16 */
    int n_kv_heads, head_dim, v_head_dim, window;
    kiln_attn_params p;
} kcu_attn_args;

#ifndef KCU_HOST_EMU
/* Causal (window-limited) GQA attention, optional logit softcap; splits long key ranges over
 * blocks and merges them by log-sum-exp. */
void kcu_attention(kcu_state *st, const kcu_attn_args *a);
#endif

/* One sequence of a batched attention launch: its cache buffers, first position, token count and
 * first row in the stacked q / out. */
typedef struct kcu_attn_seq {
    const void *k, *v;
    int pos0, n, t0;
} kcu_attn_seq;

/* The same attention for n_seq sequences in one launch (chunks of KCU_ATT_MAX_SEQ): common holds
 * the shared geometry and the stacked q / out (its n, pos0, k, v are ignored). */
#define KCU_ATT_MAX_SEQ 64

/* Decode launches whose positions come from device memory (kiln_attn_params.positions) size their
 * key splits for a bucket of key counts, not the exact count, so a recorded step stays valid for
 * every length in the bucket (splits past the real keys are empty and merge to nothing). */
static inline int kcu_attn_keys_bucket(int keys) {
    return keys <= 4096 ? (keys + 127) / 128 * 128 : (keys + 1023) / 1024 * 1024;
}
#ifndef KCU_HOST_EMU
void kcu_attention_batch(kcu_state *st, const kcu_attn_args *common, const kcu_attn_seq *seqs,
                         int n_seq);
/* The fewest keys of a decode key split (0: the planner's default), KILN_CUDA_ATT_SPLIT_KEYS */
int kcu_att_split_min_keys(void);

/* Decode (every sequence one token, n_seq <= KCU_ATT_MAX_SEQ) with common->p.prep: one launch
 * that preps q and the raw k rows (k_new [T, n_kv_heads*head_dim], v_new [T, n_kv_heads*
 * v_head_dim], stacked like q), stores the step's k / v rows in each sequence's cache at its
 * position and attends. False: not launched (the caller runs qk_norm_rope, store and attend). */
bool kcu_attention_decode_prep(kcu_state *st, const kcu_attn_args *common, const kcu_attn_seq *seqs,
                               int n_seq, const float *k_new, const float *v_new);

/* attention_prefill_tc.cu: runs the sequences of seqs that the tensor-core prefill kernel serves
 * (f16/bf16 cache, head dim 64/80/96/128/256 = v head dim, enough tokens; KILN_CUDA_FA=0 or
 * kiln_cuda_set_fa_mode(0): none) and copies the others into rest; returns their count. */
int kcu_attention_prefill_tc(kcu_state *st, const kcu_attn_args *a, const kcu_attn_seq *seqs,
                             int n_seq, kcu_attn_seq *rest);
#endif

#endif
