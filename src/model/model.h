/* model.h — the loaded model: config, mapped weights, backend, and the family that runs it.
 * A family (llama.c, ...) maps tensor names to weights at load and implements the batched
 * forward. Everything per-sequence lives in kiln_seq (its KV cache). */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include "backend/backend.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "kiln.h"

typedef struct kiln_model kiln_model;

typedef struct kiln_family {
    const char *name;
    /* Does this family run config->model_type? */
    bool (*matches)(const kiln_config *cfg);
    /* Maps weights (m->archive) into m->family_state and fills m->kv_layers / m->info. */
    kiln_status (*load)(kiln_model *m);
    /* Batched forward; entries validated by the engine (distinct seqs, ids in range). */
    kiln_status (*forward)(kiln_model *m, kiln_batch_entry *entries, int n_entries);
    void (*free)(kiln_model *m);
} kiln_family;

struct kiln_seq {
    kiln_model *model;
    kiln_kv *kv;
};

/* Scratch memory on the model's backend that grows as needed. */
typedef struct kiln_scratch {
    void *ptr;
    size_t cap;
} kiln_scratch;

struct kiln_model {
    char *dir;
    long serial; /* 1, 2, .. in load order in the process (names a model in diagnostic logs) */
    kiln_config cfg;
    kiln_st_archive *archive;
    kiln_backend *be;
    const kiln_family *family;
    void *family_state;
    kiln_kv_options kv_opts;
    int n_kv_layers;
    kiln_kv_layer_desc *kv_layers; /* [n_layers] geometry for caches */
    int max_tokens;                /* context limit per sequence */
    kiln_model_info info;
    char *quant_summary; /* owned string behind info.quant_summary */
    char *layer_pattern; /* owned string behind info.layer_pattern */
    /* [n_kv_layers] or NULL: layers whose MLP is a sparse MoE (set by the family at load,
     * shown as "+M" in the layer pattern; freed with the model) */
    bool *layer_moe;
    int32_t eos_ids[KILN_MAX_EOS];
    void *kv_shared; /* paged KV pool of this model's sequences (kv_factory) */
    /* sampling inside the forward (logits_head.c): chosen ids on the backend, and a host row of
     * logits for sampling on the host when the logits live elsewhere */
    kiln_scratch sample_ids;
    float *sample_host_row;
    const kiln_sample_request *sample_requests; /* [n_entries] during kiln_forward_sample */
};

/* ---- weight mapping helpers (weights.c) ---- */

/* Loads module `<name>` (".weight" and, if quantized, ".scales"/".biases"; ".bias" if present and
 * want_bias) as a [rows, cols] matrix, checking shapes; uploads to the backend. rows/cols are the
 * expected logical shape. */
kiln_status kiln_weights_matrix(kiln_model *m, const char *module, int64_t rows, int64_t cols,
                                bool want_bias, kiln_matrix *out);
/* Loads a 1-D tensor `<name>` of n elements as f32 on the backend (norm weights, biases).
 * add_one: store 1+w. Returns a backend pointer in *out. */
kiln_status kiln_weights_vector(kiln_model *m, const char *name, int64_t n, bool add_one,
                                float **out);
bool kiln_weights_has(const kiln_model *m, const char *name);
/* The matrices modules[0..count) (same width cols, rows[i] each; count <= KILN_WEIGHTS_MAX_FUSED)
 * into outs[]: where the backend offers upload_matrices and they share a format, as consecutive
 * row ranges of one allocation (outs[1..] views: free each with kiln_weights_free_matrix, in any
 * order); otherwise one by one, as kiln_weights_matrix. */
#define KILN_WEIGHTS_MAX_FUSED 4
kiln_status kiln_weights_matrices(kiln_model *m, int count, const char *const *modules,
                                  const int64_t *rows, int64_t cols, bool want_bias,
                                  kiln_matrix *outs);
/* The matrices modules[0..count) (each [rows, cols], one format, no output bias) as one
 * [count*rows, cols] matrix where the backend offers upload_stack (MoE experts stored one tensor
 * each); KILN_ERR_UNSUPPORTED (no error set) where it does not or they differ, for the caller to
 * load them one by one. */
kiln_status kiln_weights_stack(kiln_model *m, int count, const char *const *modules, int64_t rows,
                               int64_t cols, kiln_matrix *out);
/* The token embedding "model.embed_tokens" [vocab, hidden], the LM head [vocab, hidden] and the
 * final norm "model.norm.weight" [hidden]. The head is the embedding itself (*tied set) where the
 * config ties them or the checkpoint has no lm_head, as transformers does. */
kiln_status kiln_weights_embed_head(kiln_model *m, int64_t vocab, int64_t hidden,
                                    kiln_matrix *embed, kiln_matrix *lm_head, bool *tied,
                                    float **final_norm);
void kiln_weights_free_matrix(kiln_model *m, kiln_matrix *w);
void kiln_weights_free_vector(kiln_model *m, float *v);

/* RoPE inverse frequencies for rot_dim rotated dims, with the config's scaling (default, linear,
 * llama3, ...). out: host array [rot_dim/2]. */
kiln_status kiln_rope_inv_freq(const kiln_rope_config *rope, int rot_dim, float *out);

/* Rounds inv_freq to a 16-bit float dtype (no-op for others), as transformers does when the
 * model runs in the dtype its dense weights are stored in. */
void kiln_rope_round_to_dtype(float *inv_freq, int n, kiln_dtype dtype);

/* The rotated dims of a head_dim-wide head under the config's partial_rotary_factor (even) in
 * *rot, and their inverse frequencies, rounded to dtype (the dense weights' dtype), uploaded to
 * m's backend in *inv_freq [rot/2]. */
kiln_status kiln_rope_upload(kiln_model *m, int head_dim, kiln_dtype dtype, int *rot,
                             float **inv_freq);

/* Registered families (families.c). */
const kiln_family *kiln_family_find(const kiln_config *cfg);
/* The model_type values the registered families run, for error messages. */
const char *kiln_family_supported_types(void);

kiln_status kiln_scratch_reserve(kiln_backend *be, kiln_scratch *s, size_t bytes);
void kiln_scratch_free(kiln_backend *be, kiln_scratch *s);

/* The end of a family's forward: final norm on the rows that want logits, LM head, soft-cap,
 * copy into each entry's logits_out (logits_head.c). */
typedef struct kiln_logits_head {
    int64_t hidden, vocab;
    const float *final_norm; /* [hidden] on the backend */
    float eps;
    bool plus_one; /* norm scales by 1+w */
    const kiln_matrix *lm_head;
    float softcap; /* final logit soft-capping (0 = off) */
} kiln_logits_head;
/* Total new tokens T of a batch and the rows R that want logits. */
void kiln_batch_sizes(const kiln_batch_entry *e, int n_entries, int64_t *tokens, int64_t *rows);
/* The batch's caches, for one store_attend_batch call per layer (batch.c): ok when every entry's
 * cache has one vtable offering it; then kvs[i] / n[i] are entry i's cache and new tokens. */
typedef struct kiln_batch_kv {
    bool ok;
    const kiln_kv_vtable *vt;
    kiln_kv **kvs; /* [n_entries] */
    int *n;        /* [n_entries] */
} kiln_batch_kv;
kiln_status kiln_batch_kv_init(kiln_batch_kv *b, const kiln_batch_entry *e, int n_entries);
void kiln_batch_kv_free(kiln_batch_kv *b);
/* Reserves room for each entry's new tokens in its cache: a forward calls it before it changes
 * any state, so a full cache fails the batch cleanly. */
kiln_status kiln_batch_reserve(kiln_batch_entry *e, int n_entries);
/* A forward's start once the scratch is reserved: kiln_batch_kv_init, then the ids and positions
 * uploaded to tok_pos (kiln_batch_upload_ids); b is freed again when the upload fails. */
kiln_status kiln_batch_begin(kiln_backend *be, kiln_batch_kv *b, const kiln_batch_entry *e,
                             int n_entries, int64_t T, int32_t *tok_pos);
/* Commits each entry's new tokens to its cache (after every layer stored them). */
void kiln_batch_commit(kiln_batch_entry *e, int n_entries);
/* The most sequences of a one-token-each decode step that run as one recorded graph (where the
 * backend offers graphs): 64, or KILN_GRAPH_MAX_BATCH (64 measured 1.12x 8 at batch 64 on the
 * H200, Qwen3-0.6B bf16; docs/gpu.md). */
int kiln_graph_max_batch(void);
/* Whether this forward is a decode step that may run as one recorded unit (backend.h
 * graph_begin): the backend offers it, every cache takes the batched store + attend, each entry
 * brings one token, and the batch is at most kiln_graph_max_batch() sequences. */
bool kiln_decode_step_recordable(const kiln_backend *be, const kiln_batch_kv *b, int64_t T,
                                 int n_entries);
/* Key of a recorded decode step: everything its launches depend on apart from the ids and
 * positions in backend memory — the family state and activation buffers (`family`, `acts`, `ids`),
 * the batch size, and each cache's buffers and attention geometry (kiln_kv_vtable.graph_key).
 * 0 (record without keeping) when a cache offers no key. Families whose steps read more
 * per-sequence state (recurrent layer states) fold it in with kiln_hash_mix. */
uint64_t kiln_decode_step_key(const void *family, const void *acts, const void *ids,
                              const kiln_batch_kv *b, int n_entries);
/* Uploads the batch's ids and positions (cache length + j) to tok_pos [2T] in backend memory:
 * tok_pos[0..T) ids, tok_pos[T..2T) positions, entries' tokens stacked. */
kiln_status kiln_batch_upload_ids(kiln_backend *be, const kiln_batch_entry *e, int n_entries,
                                  int64_t T, int32_t *tok_pos);
/* x: [T, hidden] residual stream of the batch (entries' tokens stacked); rows: [R, hidden]
 * scratch for the normed rows; logits_scratch holds [R, vocab] across calls. */
kiln_status kiln_logits_head_run(kiln_model *m, const kiln_logits_head *h, kiln_batch_entry *e,
                                 int n_entries, const float *x, float *rows,
                                 kiln_scratch *logits_scratch);

#endif
