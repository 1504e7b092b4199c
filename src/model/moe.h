/* moe.h — a sparse mixture-of-experts feed-forward block (qwen3_moe, qwen3_next): softmax router
 * over E experts, top-k selection (optionally renormalised), SwiGLU experts, and an optional
 * shared expert scaled by sigmoid(shared_expert_gate(x)). Experts load from the HF layout
 * (`<prefix>.experts.N.{gate,up,down}_proj`) or mlx-lm's stacked one
 * (`<prefix>.switch_mlp.{gate,up,down}_proj` [E, out, in], read as per-expert row views).
 * Only the experts a token selects are read. Runs on any backend: routing on the host, or on the
 * backend for small batches where it offers the MoE ops (backend.h moe_route). */
#ifndef KILN_MODEL_MOE_H
#define KILN_MODEL_MOE_H

#include "model/model.h"

#include <stdio.h>

typedef struct kiln_moe {
    int hidden, n_experts, top_k, ffn, shared_ffn; /* shared_ffn 0 = no shared expert */
    bool norm_topk;
    bool stacked;         /* stack[] holds the experts (mlx-lm switch_mlp layout, or the HF one
                             uploaded by upload_stack); the per-expert matrices are its views */
    kiln_matrix router;   /* [E, hidden] */
    kiln_matrix stack[3]; /* stacked only: gate/up [E*ffn, hidden], down [E*hidden, ffn] */
    kiln_matrix *gate;    /* [E] each [ffn, hidden] */
    kiln_matrix *up;      /* [E] each [ffn, hidden] */
    kiln_matrix *down;    /* [E] each [hidden, ffn] */
    kiln_matrix sh_gate, sh_up,
        sh_down;           /* shared expert [sf, hidden], [sf, hidden], [hidden, sf] */
    kiln_matrix sh_router; /* [1, hidden] shared_expert_gate */
} kiln_moe;

/* Loads the block under prefix (e.g. "model.layers.3.mlp"). shared_ffn > 0 loads
 * `<prefix>.shared_expert.*` and `<prefix>.shared_expert_gate`. */
kiln_status kiln_moe_load(kiln_model *m, const char *prefix, int hidden, int n_experts, int top_k,
                          int ffn, bool norm_topk, int shared_ffn, kiln_moe *out);
void kiln_moe_free(kiln_model *m, kiln_moe *moe);

/* y[T, hidden] = moe(x[T, hidden]) on the model's backend (y, x in its memory; work: backend
 * scratch kept across calls). y must not alias x. */
kiln_status kiln_moe_forward(kiln_model *m, const kiln_moe *moe, float *y, const float *x,
                             int64_t T, kiln_scratch *work);

/* Forwards of up to this many tokens run the block with its routing on the backend (0: never):
 * be->moe_device_max_tokens (KILN_MOE_DEVICE_TOKENS=N at backend creation overrides the
 * backend's own); 0 without the ops. */
int kiln_moe_device_max_tokens(const kiln_backend *be);

/* Whether a forward of T tokens choosing top_k experts from the given stacks routes on the
 * backend: up to kiln_moe_device_max_tokens tokens (decode steps), or, unless
 * KILN_MOE_DEVICE_TOKENS set the limit, any T whose T * top_k pairs the backend's gathers take
 * grouped over every stack (be->moe_gather_grouped: prefill on the tensor-core expert GEMM). */
bool kiln_moe_routes_on_device(const kiln_backend *be, int64_t T, int top_k, int n_stacks,
                               const kiln_matrix *const *stacks);

/* Forwards routed on the backend run in chunks of at most this many tokens (2048; bounds the
 * scratch of the (token, expert) pairs: chunk * top_k * (ffn + hidden) floats). Tests set a
 * small one (<= 0: back to the default). */
int64_t kiln_moe_device_chunk(void);
void kiln_moe_set_device_chunk(int64_t tokens);

/* Whether kiln_moe_forward of T tokens runs on the backend with nothing waiting for the host (so
 * a decode step through it can be recorded). */
bool kiln_moe_on_device(const kiln_model *m, const kiln_moe *o, int64_t T);

/* MoE blocks run on the backend so far in this process (moe.c and gemma.c count them): how
 * tests see which forward ran. */
void kiln_moe_count_device_call(void);
long kiln_moe_device_calls(void);

/* Router math on one token: probs[E] = softmax(logits); picks top_k (ties -> lower index) into
 * idx[k] with weights w[k] (renormalised if norm_topk). Exposed for tests. */
void kiln_moe_route(const float *logits, int n_experts, int top_k, bool norm_topk, int *idx,
                    float *w);

/* One routing-log line per token (KILN_MOE_LOG, moe.c): "moe <run> <call> <t> <experts> <margin>"
 * with margin = logits[idx[k-1]] minus the best logit not chosen. */
void kiln_moe_route_print(FILE *f, const char *run, long call, int64_t t, const float *logits,
                          int n_experts, int top_k, const int *idx);

#endif
