/* attention_paged.cuh — the paged-cache attention launcher (attention_paged.cu), used by the
 * device paged caches of kv_paged.cu. Internal to src/backend/cuda/. */
#ifndef KILN_CUDA_ATTENTION_PAGED_CUH
#define KILN_CUDA_ATTENTION_PAGED_CUH

#ifndef KCU_HOST_EMU /* tests/emu/paged_attention_emulate.cc: no CUDA headers */
#include "backend/cuda/attention.cuh"
#endif
#include "backend/cuda/kv_codec.cuh"

/* One sequence of a paged launch: its device block table ([blocks][table_stride] ids), first
 * position (its length before this step), token count and first row of the stacked rows. */
typedef struct kcu_paged_seq {
    const int32_t *table;
    int pos0, n, t0;
} kcu_paged_seq;

#ifndef KCU_HOST_EMU
/* Causal (window-limited) GQA attention of the stacked queries q [T, n_heads*head_dim] of n_seq
 * sequences against their paged K/V (stored through the block tables, decoded in the kernel) ->
 * out [T, n_heads*v_head_dim]; long key ranges are split and merged by log-sum-exp; TurboQuant
 * values (L.v.rotate) are unrotated once per output row. p->positions (device, optional) gives
 * each sequence's first position instead of seqs[i].pos0 (recorded decode steps). */
void kcu_paged_attention(kcu_state *st, const kcu_paged_layer *L, const float *q, float *out,
                         const kiln_attn_params *p, const kcu_paged_seq *seqs, int n_seq);
/* The tensor-core prefill kernel (attention_prefill_tc.cu) on the sequences of a paged launch it
 * takes (>= 64 tokens, head dim 64/80/96/128/256 = v head dim, keys not rotated; positions from
 * the host's pos0; rotated values: the rows unrotated after); the others are copied to rest[] for
 * kcu_paged_attention's kernel. Returns their count. */
/* Each output row (token of seqs[i], query head) of out [T, n_heads*v_head_dim] back from the
 * values' rotated basis (L->v.rotate): x <- D.H.x / sqrt(v_head_dim). */
void kcu_paged_unrotate_rows(kcu_state *st, const kcu_paged_layer *L, float *out,
                             const kiln_attn_params *p, const kcu_paged_seq *seqs, int n_seq);
int kcu_attention_prefill_tc_paged(kcu_state *st, const kcu_paged_layer *L, const float *q,
                                   float *out, const kiln_attn_params *p, const kcu_paged_seq *seqs,
                                   int n_seq, kcu_paged_seq *rest);
#endif

#endif
