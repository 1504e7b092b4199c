/* kiln.h — the public API of libkiln, a local LLM runtime.
 *
 * Contract: every function that can fail returns a kiln_status; on failure the thread's last error
 * message (kiln_last_error) says what went wrong, naming the file / tensor / field involved.
 * Nothing here aborts on bad input. Objects come in new/free pairs; free(NULL) is a no-op.
 *
 * Flow: kiln_model_load -> kiln_seq_new (one per sequence: owns its KV state) -> kiln_forward over
 * a batch of (sequence, new tokens) entries -> logits -> kiln_sampler_sample -> next token (or
 * kiln_forward_sample: the forward picks the next token itself, on the GPU for --device cuda).
 */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------------------------- */
typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_INVALID_ARG, /* caller passed something malformed (bad ids, shapes, options) */
    KILN_ERR_IO,          /* a file could not be opened/read/written */
    KILN_ERR_FORMAT,      /* a file is corrupt or inconsistent (bad JSON, header, offsets) */
    KILN_ERR_UNSUPPORTED, /* valid input kiln does not implement (architecture, dtype, option) */
    KILN_ERR_NOT_FOUND,   /* a named thing (tensor, file, token) is missing */
    KILN_ERR_OOM,         /* an allocation failed */
    KILN_ERR_CACHE_FULL,  /* the KV pool / cache has no room: retry later or shorten */
    KILN_ERR_CANCELLED,   /* the operation was cancelled */
    KILN_ERR_DEVICE,      /* a backend (CUDA) call failed */
    KILN_ERR_INTERNAL,    /* a bug in kiln */
} kiln_status;

/* Message for the last failure on this thread ("" if none). Valid until the next kiln call. */
const char *kiln_last_error(void);
const char *kiln_status_name(kiln_status status);

/* ---- logging ------------------------------------------------------------------------------ */
typedef enum { KILN_LOG_ERROR = 0, KILN_LOG_WARN, KILN_LOG_INFO, KILN_LOG_DEBUG } kiln_log_level;
void kiln_set_log_level(kiln_log_level level); /* default WARN; messages go to stderr */

/* ---- model -------------------------------------------------------------------------------- */
typedef struct kiln_model kiln_model;

typedef enum { KILN_DEVICE_CPU = 0, KILN_DEVICE_CUDA = 1 } kiln_device;

/* Which KV cache kind new sequences get, and its parameters. Parsed from "--kv" strings by
 * kiln_kv_options_parse: "f32" (default), "f16", "bf16", "q8", "q4", "turbo:k8v3", ... */
typedef struct kiln_kv_options {
    char kind[32];        /* "f32", "f16", "bf16", "q8", "q4", "turbo:kXvY" */
    int block_tokens;     /* paged block size in tokens (0 = default 16) */
    int64_t budget_bytes; /* paged pool budget (0 = default) */
    bool paged;           /* use the paged pool */
} kiln_kv_options;

/* How the weight files are held: mapped (pages of the files, shared with the page cache) or read
 * into memory (a private copy in transparent huge pages: the CPU's decode streams every weight
 * once per token, and on 4 KiB pages it misses the TLB every page; Qwen3-0.6B-shape 8-bit decode
 * on 2 Zen 2 cores ran 18% faster). AUTO reads them in for the CPU device when the files take at
 * most half of the memory available, and maps them otherwise (and for CUDA, which uploads). */
typedef enum {
    KILN_WEIGHTS_AUTO = 0,
    KILN_WEIGHTS_MMAP = 1,
    KILN_WEIGHTS_MEMORY = 2
} kiln_weights_mode;

typedef struct kiln_load_options {
    kiln_device device;
    int n_threads;             /* 0 = all cores */
    bool show_progress;        /* progress lines on stderr for long loads */
    kiln_kv_options kv;        /* cache kind for sequences created from this model */
    kiln_weights_mode weights; /* default AUTO */
} kiln_load_options;

void kiln_load_options_default(kiln_load_options *opts);

/* CPU matmul precision for every model in the process: "exact" (default; f32 activations, logits
 * match the reference to ~1e-6) or "fast" (int8 / bf16 activations, ~1e-2 relative per matmul,
 * like llama.cpp's quantized dot products: every 4/8-bit and bf16 matmul on VNNI / AVX512-BF16
 * CPUs, the 4/8-bit GEMV on AVX2-only ones). */
kiln_status kiln_set_cpu_matmul_mode(const char *mode);
/* The same switch for every backend of the process: the CPU as above, and CUDA's GEMMs ("exact":
 * x as a bf16 hi + lo pair, quantized/f16 weights as a pair too; "fast": one bf16 product, like
 * llama.cpp, vLLM and transformers in bf16). CLI: --fast-math. */
kiln_status kiln_set_matmul_mode(const char *mode);
kiln_status kiln_kv_options_parse(const char *text, kiln_kv_options *out);

kiln_status kiln_model_load(const char *dir, const kiln_load_options *opts, kiln_model **out);
void kiln_model_free(kiln_model *model);

typedef struct kiln_model_info {
    const char *architecture; /* "llama", "qwen2", "qwen3", ... (config model_type) */
    int vocab_size;
    int hidden_size;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int64_t n_params;            /* logical parameters (quantized weights counted unpacked) */
    int64_t weight_bytes;        /* bytes of weight data as stored */
    int64_t active_weight_bytes; /* of those, what one decode token reads: all but the experts
                                    a MoE layer's router leaves out (top_k of E) */
    int n_experts;               /* routed experts per MoE layer (0: a dense model) */
    int experts_per_token;       /* of those, how many a token uses (top_k) */
    int64_t kv_bytes_per_token;  /* across all layers, for the model's cache kind */
    int64_t state_bytes_fixed;   /* per-sequence fixed state (recurrent layers), 0 if none */
    int max_position;
    int n_eos;
    const int32_t *eos_ids;    /* [n_eos] */
    int bos_id;                /* -1 if none */
    const char *quant_summary; /* human-readable quantization per module kind */
    const char *layer_pattern; /* e.g. "F F F F" or "L L L F ..." */
} kiln_model_info;

const kiln_model_info *kiln_model_get_info(const kiln_model *model);

/* ---- sequences and the batched forward ----------------------------------------------------- */
typedef struct kiln_seq kiln_seq;

kiln_status kiln_seq_new(kiln_model *model, kiln_seq **out);
void kiln_seq_free(kiln_seq *seq);
int kiln_seq_len(const kiln_seq *seq);                 /* tokens held in the cache */
kiln_status kiln_seq_truncate(kiln_seq *seq, int len); /* roll back to the first len tokens */
/* For benchmarks of long-context decoding: appends n_tokens positions of synthetic keys and values
 * (seeded random rows of unit variance) to every attention layer of the sequence's cache through
 * the cache's own store, so quantized kinds encode them as usual, without running the model.
 * Recurrent layers' state is left as is. The positions hold no real tokens: measure speed with
 * them, never quality. Fails like kiln_forward when the cache is full. */
kiln_status kiln_seq_fill_synthetic(kiln_seq *seq, int n_tokens, uint64_t seed);
/* Prefix sharing (paged KV kinds: --kv other than f32, or --kv-block/--kv-budget). On an empty
 * sequence, attaches the longest run of cached full blocks matching tokens[0..n_tokens) (blocks
 * become cached when a sequence of the same model commits them) and sets *n_reused to the tokens
 * reused, at most n_tokens-1 so the caller still forwards tokens[*n_reused..] and gets logits for
 * the last one. Hybrid models (recurrent layers) reuse only up to the last block boundary at
 * which a forward call of some sequence ended (a recurrent-state snapshot is cached there).
 * Other cache kinds, or models with sliding layers: *n_reused = 0. */
kiln_status kiln_seq_prefix_attach(kiln_seq *seq, const int32_t *tokens, int n_tokens,
                                   int *n_reused);

typedef enum {
    KILN_LOGITS_NONE = 0, /* no logits for this entry */
    KILN_LOGITS_LAST,     /* logits of the last token: [vocab] */
    KILN_LOGITS_ALL,      /* logits of every token: [n_tokens, vocab] */
} kiln_logits_mode;

typedef struct kiln_batch_entry {
    kiln_seq *seq;         /* its cache is extended by n_tokens */
    const int32_t *tokens; /* [n_tokens] new tokens, positions seq_len .. seq_len+n_tokens-1 */
    int n_tokens;
    kiln_logits_mode logits;
    float *logits_out; /* caller-owned: [vocab] or [n_tokens, vocab]; NULL allowed when sampled */
} kiln_batch_entry;

/* One forward step over several sequences at once; each entry must name a distinct sequence. */
kiln_status kiln_forward(kiln_model *model, kiln_batch_entry *entries, int n_entries);

typedef struct kiln_sampler kiln_sampler; /* see "sampling" below */

/* What kiln_forward_sample picks for one entry: *token_out gets the id that
 * kiln_sampler_sample(sampler, the entry's last logits, history, n_history) would return, and the
 * sampler's generator advances exactly as that call would. */
typedef struct kiln_sample_request {
    kiln_sampler *sampler;  /* NULL: the entry is not sampled */
    const int32_t *history; /* [n_history] tokens so far (prompt + generated), for penalties */
    int n_history;
    int32_t *token_out;
} kiln_sample_request;

/* kiln_forward, then the next token of every entry whose samples[i].sampler is set (such entries
 * need logits = KILN_LOGITS_LAST; their logits_out may be NULL, and if given receives the logits
 * before penalties). samples: [n_entries]. On --device cuda the choice is made on the GPU and only
 * the ids are copied back (env KILN_GPU_SAMPLING=0: logits come back and the host samples); the
 * CPU backend samples on the host, so the tokens are the same as kiln_forward followed by
 * kiln_sampler_sample on either device, up to float rounding of the device's softmax. */
kiln_status kiln_forward_sample(kiln_model *model, kiln_batch_entry *entries, int n_entries,
                                const kiln_sample_request *samples);

/* ---- tokenizer ---------------------------------------------------------------------------- */
typedef struct kiln_tokenizer kiln_tokenizer;

kiln_status kiln_tokenizer_load(const char *model_dir, kiln_tokenizer **out);
void kiln_tokenizer_free(kiln_tokenizer *tok);
/* Encode UTF-8 text; add_special applies the post-processor (BOS etc.). *out is malloc'd. */
kiln_status kiln_tokenize(const kiln_tokenizer *tok, const char *text, size_t len, bool add_special,
                          int32_t **out, int *n_out);
/* Same, also giving each id's span of the input: (*offsets)[i] = {start, end} as Unicode code point
 * (char) indices into text, end exclusive, exactly as Hugging Face `tokenizers` reports them in
 * its Python API (Encoding.offsets; the Node binding gives the same numbers). Spans are tracked
 * through normalizers, pre-tokenizers, BPE merges and added tokens; a byte-level token that holds
 * only part of a character spans that whole character (so neighbours may overlap), and special
 * tokens added by the post-processor get {0, 0}. *ids and *offsets are malloc'd (n_out entries). */
kiln_status kiln_tokenize_offsets(const kiln_tokenizer *tok, const char *text, size_t len,
                                  bool add_special, int32_t **ids, int32_t (**offsets)[2],
                                  int *n_out);
/* Decode ids to UTF-8 text; *out is malloc'd and NUL-terminated. */
kiln_status kiln_detokenize(const kiln_tokenizer *tok, const int32_t *ids, int n, bool skip_special,
                            char **out);
/* Same, also giving the byte length (decoded text may contain U+0000, which the plain
 * NUL-terminated form cannot show). */
kiln_status kiln_detokenize_len(const kiln_tokenizer *tok, const int32_t *ids, int n,
                                bool skip_special, char **out, size_t *len);
int kiln_tokenizer_vocab_size(const kiln_tokenizer *tok);
int32_t kiln_tokenizer_token_id(const kiln_tokenizer *tok, const char *token); /* -1 if absent */

/* Streaming detokenizer: feed ids one at a time, get back only complete UTF-8 text. */
typedef struct kiln_detok_stream kiln_detok_stream;
kiln_status kiln_detok_stream_new(const kiln_tokenizer *tok, bool skip_special,
                                  kiln_detok_stream **out);
/* Appends the newly completed text (possibly empty) to *text (malloc'd, NUL-terminated). */
kiln_status kiln_detok_stream_push(kiln_detok_stream *s, int32_t id, char **text);
/* Returns whatever is still held back (invalid UTF-8 tail rendered as U+FFFD). */
kiln_status kiln_detok_stream_flush(kiln_detok_stream *s, char **text);
void kiln_detok_stream_free(kiln_detok_stream *s);

/* ---- chat templates ------------------------------------------------------------------------ */
/* Renders the model's chat template (tokenizer_config.json `chat_template` or chat_template.jinja)
 * as transformers.apply_chat_template(tokenize=False) does. messages_json: JSON array of messages;
 * tools_json: JSON array or NULL; kwargs_json: JSON object of extra template variables (e.g.
 * {"enable_thinking": false}) or NULL. *out is malloc'd. */
kiln_status kiln_chat_render(const kiln_tokenizer *tok, const char *messages_json,
                             const char *tools_json, bool add_generation_prompt,
                             const char *kwargs_json, char **out);
bool kiln_tokenizer_has_chat_template(const kiln_tokenizer *tok);

/* ---- sampling ----------------------------------------------------------------------------- */
typedef struct kiln_sampler_params {
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off (HF semantics: divide positive, multiply negative) */
    float presence_penalty;   /* 0 = off (OpenAI semantics) */
    float frequency_penalty;  /* 0 = off */
    int penalty_last_n;       /* window of history for penalties (0 = all) */
    uint64_t seed;
} kiln_sampler_params;

void kiln_sampler_params_default(kiln_sampler_params *p);
/* The model's defaults from generation_config.json (greedy unless it sets do_sample): fills
 * temperature, top_k, top_p and repetition_penalty; leaves the other fields alone. */
void kiln_model_default_sampling(const kiln_model *model, kiln_sampler_params *p);

kiln_status kiln_sampler_new(const kiln_sampler_params *p, int vocab_size, kiln_sampler **out);
void kiln_sampler_free(kiln_sampler *s);
/* Picks a token from logits[vocab] (modified in place by penalties), given the history so far. */
int32_t kiln_sampler_sample(kiln_sampler *s, float *logits, const int32_t *history, int n_history);
/* For sampling elsewhere (kiln_forward on the device): the uniform number in [0, 1) that the next
 * kiln_sampler_sample call would draw, consuming the generator exactly as that call would — one
 * draw when sampling, none (returns 0) for greedy settings (temperature 0 or top_k 1). */
double kiln_sampler_draw_uniform(kiln_sampler *s);
const kiln_sampler_params *kiln_sampler_get_params(const kiln_sampler *s);
int kiln_sampler_vocab(const kiln_sampler *s);

#ifdef __cplusplus
}
#endif
#endif /* KILN_H */
