/* moe.c — the sparse MoE block (see moe.h): loading both expert layouts and the two forwards.
 * Bucketed (any backend, any token count): router logits come to the host for the top-k choice,
 * tokens are bucketed per selected expert so each expert runs one matmul over its rows, the
 * buckets go back as row ids and weights, and the experts run as backend ops (gather, matmuls,
 * weighted scatter-add). On the device (backends with moe_route / matmul_gather / moe_combine,
 * up to moe_device_max_tokens tokens: decode steps; and prefill where the gathers run grouped,
 * kiln_moe_routes_on_device): the top-k choice, one gathered matmul per projection over all
 * (token, choice) pairs and the weighted sum all stay on the backend, so nothing waits for the
 * host and the step can be recorded as a graph. */
#include "model/moe.h"

#include "backend/cpu/cpu_ops.h"
#include "util/status.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Loads a stacked [E, rows, cols] expert tensor (mlx-lm switch_mlp) as one [E*rows, cols]
 * matrix; quantized when `<module>.scales` exists. */
static kiln_status load_stacked(kiln_model *m, const char *module, int E, int64_t rows,
                                int64_t cols, kiln_matrix *out) {
    char name[512];
    memset(out, 0, sizeof *out);
    snprintf(name, sizeof name, "%s.weight", module);
    const kiln_st_tensor *w = kiln_st_find(m->archive, name);
    if (!w) return kiln_error(KILN_ERR_NOT_FOUND, "%s: tensor '%s' is missing", m->dir, name);
    snprintf(name, sizeof name, "%s.scales", module);
    const kiln_st_tensor *sc = kiln_st_find(m->archive, name);
    snprintf(name, sizeof name, "%s.biases", module);
    const kiln_st_tensor *bi = kiln_st_find(m->archive, name);
    kiln_matrix host = {.rows = E * rows, .cols = cols};
    if (sc) {
        int bits = 0, group = 0;
        if (!kiln_config_module_quant(&m->cfg, module, &bits, &group)) {
            bits = m->cfg.quant_bits;
            group = m->cfg.quant_group_size;
        }
        if (sc->ndim == 3 && sc->shape[2] > 0 && group <= 0) group = (int)(cols / sc->shape[2]);
        if (w->ndim == 3 && bits <= 0) bits = (int)(w->shape[2] * 32 / cols);
        if (!bi || w->dtype != KILN_DT_U32 || bits < 2 || bits > 8 || group <= 0 || cols % group ||
            (cols * bits) % 32 || w->ndim != 3 || w->shape[0] != E || w->shape[1] != rows ||
            w->shape[2] != cols * bits / 32 || sc->ndim != 3 || sc->shape[0] != E ||
            sc->shape[1] != rows || sc->shape[2] != cols / group || bi->ndim != 3 ||
            bi->dtype != sc->dtype || bi->shape[2] != sc->shape[2])
            return kiln_error(KILN_ERR_FORMAT,
                              "%s: stacked experts '%s' do not match [%d, %lld, %lld] at %d-bit "
                              "group %d",
                              m->dir, module, E, (long long)rows, (long long)cols, bits, group);
        host.dtype = KILN_DT_U32;
        host.bits = bits;
        host.group_size = group;
        host.scale_dtype = sc->dtype;
        host.data = w->data;
        host.scales = sc->data;
        host.biases = bi->data;
    } else {
        if ((w->dtype != KILN_DT_F32 && w->dtype != KILN_DT_F16 && w->dtype != KILN_DT_BF16) ||
            w->ndim != 3 || w->shape[0] != E || w->shape[1] != rows || w->shape[2] != cols)
            return kiln_error(KILN_ERR_FORMAT,
                              "%s: stacked experts '%s.weight' should be a float [%d, %lld, %lld]",
                              m->dir, module, E, (long long)rows, (long long)cols);
        host.dtype = w->dtype;
        host.data = w->data;
    }
    return m->be->upload_matrix(m->be, &host, out);
}

/* The HF layout's experts (`<prefix>.experts.N.{gate,up,down}_proj`) as the three stacks of
 * mlx-lm's layout, where the backend uploads them so (kiln_weights_stack); o->stacked tells. */
static kiln_status load_expert_stacks(kiln_model *m, const char *prefix, kiln_moe *o) {
    static const char *parts[3] = {"gate_proj", "up_proj", "down_proj"};
    const int E = o->n_experts;
    char **names = calloc((size_t)E, sizeof *names);
    if (!names) return kiln_error(KILN_ERR_OOM, "out of memory");
    kiln_status st = KILN_OK;
    for (int e = 0; e < E && st == KILN_OK; e++)
        if (!(names[e] = malloc(strlen(prefix) + 48)))
            st = kiln_error(KILN_ERR_OOM, "out of memory");
    int made = 0;
    for (; made < 3 && st == KILN_OK; made++) {
        for (int e = 0; e < E; e++) sprintf(names[e], "%s.experts.%d.%s", prefix, e, parts[made]);
        st = kiln_weights_stack(m, E, (const char *const *)names, made < 2 ? o->ffn : o->hidden,
                                made < 2 ? o->hidden : o->ffn, &o->stack[made]);
    }
    if (st == KILN_OK) {
        o->stacked = true;
    } else {
        for (int p = 0; p < 3; p++) kiln_weights_free_matrix(m, &o->stack[p]);
        if (st == KILN_ERR_UNSUPPORTED) st = KILN_OK; /* one tensor at a time, then */
    }
    for (int e = 0; e < E; e++) free(names[e]);
    free(names);
    return st;
}

kiln_status kiln_moe_load(kiln_model *m, const char *prefix, int hidden, int n_experts, int top_k,
                          int ffn, bool norm_topk, int shared_ffn, kiln_moe *o) {
    char n[400];
    memset(o, 0, sizeof *o);
    o->hidden = hidden;
    o->n_experts = n_experts;
    o->top_k = top_k;
    o->ffn = ffn;
    o->norm_topk = norm_topk;
    o->shared_ffn = shared_ffn;
    if (n_experts <= 0 || top_k <= 0 || top_k > n_experts || ffn <= 0)
        return kiln_error(KILN_ERR_FORMAT,
                          "%s/config.json: bad MoE geometry (%d experts, top %d, ffn %d)", m->dir,
                          n_experts, top_k, ffn);
    snprintf(n, sizeof n, "%s.gate", prefix);
    KILN_TRY(kiln_weights_matrix(m, n, n_experts, hidden, false, &o->router));
    o->gate = calloc((size_t)n_experts, sizeof *o->gate);
    o->up = calloc((size_t)n_experts, sizeof *o->up);
    o->down = calloc((size_t)n_experts, sizeof *o->down);
    if (!o->gate || !o->up || !o->down) return kiln_error(KILN_ERR_OOM, "out of memory");
    snprintf(n, sizeof n, "%s.switch_mlp.gate_proj.weight", prefix);
    o->stacked = kiln_weights_has(m, n);
    if (o->stacked) {
        static const char *parts[3] = {"gate_proj", "up_proj", "down_proj"};
        for (int p = 0; p < 3; p++) {
            snprintf(n, sizeof n, "%s.switch_mlp.%s", prefix, parts[p]);
            KILN_TRY(load_stacked(m, n, n_experts, p < 2 ? ffn : hidden, p < 2 ? hidden : ffn,
                                  &o->stack[p]));
        }
    } else if (m->be->matmul_gather && m->be->upload_stack) {
        KILN_TRY(load_expert_stacks(m, prefix, o)); /* sets o->stacked where the backend could */
    }
    if (o->stacked) {
        for (int e = 0; e < n_experts; e++) {
            o->gate[e] = kiln_matrix_rows(&o->stack[0], (int64_t)e * ffn, ffn);
            o->up[e] = kiln_matrix_rows(&o->stack[1], (int64_t)e * ffn, ffn);
            o->down[e] = kiln_matrix_rows(&o->stack[2], (int64_t)e * hidden, hidden);
        }
    } else {
        for (int e = 0; e < n_experts; e++) {
            snprintf(n, sizeof n, "%s.experts.%d.gate_proj", prefix, e);
            KILN_TRY(kiln_weights_matrix(m, n, ffn, hidden, false, &o->gate[e]));
            snprintf(n, sizeof n, "%s.experts.%d.up_proj", prefix, e);
            KILN_TRY(kiln_weights_matrix(m, n, ffn, hidden, false, &o->up[e]));
            snprintf(n, sizeof n, "%s.experts.%d.down_proj", prefix, e);
            KILN_TRY(kiln_weights_matrix(m, n, hidden, ffn, false, &o->down[e]));
        }
    }
    if (shared_ffn > 0) {
        snprintf(n, sizeof n, "%s.shared_expert.gate_proj", prefix);
        KILN_TRY(kiln_weights_matrix(m, n, shared_ffn, hidden, false, &o->sh_gate));
        snprintf(n, sizeof n, "%s.shared_expert.up_proj", prefix);
        KILN_TRY(kiln_weights_matrix(m, n, shared_ffn, hidden, false, &o->sh_up));
        snprintf(n, sizeof n, "%s.shared_expert.down_proj", prefix);
        KILN_TRY(kiln_weights_matrix(m, n, hidden, shared_ffn, false, &o->sh_down));
        snprintf(n, sizeof n, "%s.shared_expert_gate", prefix);
        KILN_TRY(kiln_weights_matrix(m, n, 1, hidden, false, &o->sh_router));
    }
    return KILN_OK;
}

void kiln_moe_free(kiln_model *m, kiln_moe *o) {
    if (!o) return;
    kiln_weights_free_matrix(m, &o->router);
    if (o->stacked) {
        for (int p = 0; p < 3; p++) kiln_weights_free_matrix(m, &o->stack[p]);
    } else if (o->gate && o->up && o->down) {
        for (int e = 0; e < o->n_experts; e++) {
            kiln_weights_free_matrix(m, &o->gate[e]);
            kiln_weights_free_matrix(m, &o->up[e]);
            kiln_weights_free_matrix(m, &o->down[e]);
        }
    }
    free(o->gate);
    free(o->up);
    free(o->down);
    kiln_weights_free_matrix(m, &o->sh_gate);
    kiln_weights_free_matrix(m, &o->sh_up);
    kiln_weights_free_matrix(m, &o->sh_down);
    kiln_weights_free_matrix(m, &o->sh_router);
    memset(o, 0, sizeof *o);
}

void kiln_moe_route(const float *logits, int E, int k, bool norm_topk, int *idx, float *w) {
    kiln_cpu_moe_route_ref(idx, w, logits, 1, E, k, norm_topk, NULL);
}

/* The routing log (env KILN_MOE_LOG=FILE, read once): one line per token of every MoE call,
 * "moe <run> <call> <t> <e1>,<e2>,.. <margin>": run = backend#n for the process's n-th loaded
 * model, call = a process-wide count (a run's calls in file order are its layers,
 * step after step), margin = the k-th chosen logit minus the best logit left out (how near the
 * choice was to flipping). Two runs of the same tokens (CPU and CUDA, say) line up call by call. */
static FILE *route_log(void) {
    static FILE *f;
    static bool opened;
    if (!opened) {
        opened = true;
        const char *path = getenv("KILN_MOE_LOG");
        if (path && *path) f = fopen(path, "a");
    }
    return f;
}

void kiln_moe_route_print(FILE *f, const char *run, long call, int64_t t, const float *logits,
                          int E, int k, const int *idx) {
    float left = -INFINITY; /* the best logit not chosen */
    for (int e = 0; e < E; e++) {
        bool taken = false;
        for (int j = 0; j < k; j++) taken |= idx[j] == e;
        if (!taken && logits[e] > left) left = logits[e];
    }
    fprintf(f, "moe %s %ld %lld ", run, call, (long long)t);
    for (int j = 0; j < k; j++) fprintf(f, "%s%d", j ? "," : "", idx[j]);
    fprintf(f, " %.6g\n", k < E ? (double)(logits[idx[k - 1]] - left) : 0.0);
}

static void route_log_call(const kiln_model *m, int64_t T, const float *logits, int E, int k,
                           const int *sel) {
    static _Atomic long calls;
    FILE *f = route_log();
    if (!f) return;
    char run[64];
    snprintf(run, sizeof run, "%s#%ld", m->be->name, m->serial);
    const long call = atomic_fetch_add(&calls, 1);
    for (int64_t t = 0; t < T; t++)
        kiln_moe_route_print(f, run, call, t, logits + t * E, E, k, sel + t * k);
    fflush(f);
}

static _Atomic long device_calls;
void kiln_moe_count_device_call(void) {
    atomic_fetch_add(&device_calls, 1);
}
long kiln_moe_device_calls(void) {
    return atomic_load(&device_calls);
}

int kiln_moe_device_max_tokens(const kiln_backend *be) {
    if (!be->moe_route || !be->matmul_gather || !be->matmul_gather_glu || !be->moe_combine)
        return 0;
    return be->moe_device_max_tokens; /* KILN_MOE_DEVICE_TOKENS applied by kiln_backend_new */
}

static _Atomic int64_t device_chunk = 2048;
int64_t kiln_moe_device_chunk(void) {
    return atomic_load(&device_chunk);
}
void kiln_moe_set_device_chunk(int64_t tokens) {
    atomic_store(&device_chunk, tokens > 0 ? tokens : 2048);
}

bool kiln_moe_routes_on_device(const kiln_backend *be, int64_t T, int top_k, int n_stacks,
                               const kiln_matrix *const *stacks) {
    if (!be->moe_route || !be->matmul_gather || !be->matmul_gather_glu || !be->moe_combine)
        return false;
    if (T <= be->moe_device_max_tokens) return true;
    if (be->moe_device_tokens_set || !be->moe_gather_grouped) return false;
    for (int i = 0; i < n_stacks; i++)
        if (!be->moe_gather_grouped(be, stacks[i], T * top_k)) return false;
    return true;
}

static int64_t align4(int64_t n) { /* floats, so each scratch region starts 16-byte aligned */
    return (n + 3) & ~(int64_t)3;
}

/* The block on the backend: route, the gathered SwiGLU (gate and up in one op) and down over the
 * T*K (token, choice) pairs (pair t*K + j reads x row t), the shared expert, and the weighted
 * sum. */
static kiln_status moe_forward_device(kiln_model *m, const kiln_moe *o, float *y, const float *x,
                                      int64_t T, kiln_scratch *work) {
    kiln_backend *be = m->be;
    const int64_t H = o->hidden, E = o->n_experts, K = o->top_k, F = o->ffn, SF = o->shared_ffn;
    const int64_t P = T * K;
    /* backend scratch: router logits [T, E]; shared gate logits [T]; experts (int32), weights
     * [P]; g [P, F] (the experts' SwiGLU); ye [P, H]; shared expert sg, su [T, SF], sy [T, H] */
    const int64_t n_l = align4(T * E), n_sl = align4(T), n_p = align4(P), n_g = align4(P * F),
                  n_ye = align4(P * H), n_sg = align4(T * SF), n_sy = SF > 0 ? align4(T * H) : 0;
    const size_t floats = (size_t)(n_l + n_sl + 2 * n_p + n_g + n_ye + 2 * n_sg + n_sy);
    KILN_TRY(kiln_scratch_reserve(be, work, floats * sizeof(float)));
    float *logits = work->ptr, *sh_logit = logits + n_l, *w = sh_logit + n_sl, *g = w + 2 * n_p,
          *ye = g + n_g, *sg = ye + n_ye, *su = sg + n_sg, *sy = su + n_sg;
    int32_t *experts = (int32_t *)(w + n_p);
    kiln_moe_count_device_call();
    be->matmul(be, logits, x, T, &o->router);
    be->moe_route(be, experts, w, logits, T, (int)E, (int)K, o->norm_topk, NULL);
    be->matmul_gather_glu(be, g, x, K, P, experts, &o->stack[0], &o->stack[1], F, F, 0,
                          KILN_GLU_SILU);
    be->matmul_gather(be, ye, g, 1, P, experts, &o->stack[2], H);
    if (SF > 0) {
        float *const ys[3] = {sg, su, sh_logit};
        const kiln_matrix *const ws[3] = {&o->sh_gate, &o->sh_up, &o->sh_router};
        be->matmul_multi(be, 3, ys, x, T, ws);
        be->silu_mul(be, sg, sg, su, T * SF);
        be->matmul(be, sy, sg, T, &o->sh_down);
    }
    be->moe_combine(be, y, ye, w, T, (int)K, H, SF > 0 ? sy : NULL, SF > 0 ? sh_logit : NULL);
    return KILN_OK;
}

bool kiln_moe_on_device(const kiln_model *m, const kiln_moe *o, int64_t T) {
    /* the routing log needs the logits on the host: logged runs keep the bucketed forward */
    if (!o->stacked || o->top_k > KILN_MOE_ROUTE_MAX_K ||
        o->n_experts > KILN_MOE_ROUTE_MAX_EXPERTS || route_log())
        return false;
    const kiln_matrix *const stacks[3] = {&o->stack[0], &o->stack[1], &o->stack[2]};
    return kiln_moe_routes_on_device(m->be, T, o->top_k, 3, stacks);
}

kiln_status kiln_moe_forward(kiln_model *m, const kiln_moe *o, float *y, const float *x, int64_t T,
                             kiln_scratch *work) {
    if (kiln_moe_on_device(m, o, T)) {
        const int64_t chunk = kiln_moe_device_chunk();
        for (int64_t t0 = 0; t0 < T; t0 += chunk) {
            const int64_t c = T - t0 < chunk ? T - t0 : chunk;
            KILN_TRY(moe_forward_device(m, o, y + t0 * o->hidden, x + t0 * o->hidden, c, work));
        }
        return KILN_OK;
    }
    kiln_backend *be = m->be;
    const int64_t H = o->hidden, E = o->n_experts, K = o->top_k;
    const int64_t F = o->ffn > o->shared_ffn ? o->ffn : o->shared_ffn;
    const int64_t NR = T * K + (o->shared_ffn > 0 ? T : 0); /* routed rows (+ shared rows) */
    /* backend scratch: router logits [T, E] then shared gate logits [T]; xe, ye [T, H];
     * g, u [T, F]; row ids and weights [NR] (expert by expert, then the shared rows) */
    const size_t floats = (size_t)(T * E + T + 2 * T * H + 2 * T * F + 2 * NR);
    KILN_TRY(kiln_scratch_reserve(be, work, floats * sizeof(float)));
    float *logits = work->ptr, *xe = logits + T * E + T, *ye = xe + T * H, *g = ye + T * H,
          *u = g + T * F, *d_w = u + T * F;
    int32_t *d_rows = (int32_t *)(d_w + NR);
    float *h_logits = malloc((size_t)(T * E + T) * sizeof(float)); /* [T, E] + [T] */
    int *sel = malloc((size_t)(T * K) * sizeof(int));              /* [T, K] */
    float *wsel = malloc((size_t)(T * K) * sizeof(float));         /* [T, K] */
    int32_t *h_rows = malloc((size_t)NR * sizeof(int32_t));        /* [NR] */
    float *h_w = malloc((size_t)NR * sizeof(float));               /* [NR] */
    int64_t *start = malloc((size_t)(E + 1) * sizeof(int64_t));    /* expert e: [start[e], [e+1]) */
    kiln_status st = KILN_OK;
    if (!h_logits || !sel || !wsel || !h_rows || !h_w || !start) {
        st = kiln_error(KILN_ERR_OOM, "moe: out of memory for %lld tokens", (long long)T);
        goto done;
    }
    be->matmul(be, logits, x, T, &o->router);
    if (o->shared_ffn > 0) be->matmul(be, logits + T * E, x, T, &o->sh_router); /* [T, 1] */
    be->download(be, h_logits, logits, (size_t)(T * E + (o->shared_ffn > 0 ? T : 0)) * 4);
    for (int64_t t = 0; t < T; t++)
        kiln_moe_route(h_logits + t * E, (int)E, (int)K, o->norm_topk, sel + t * K, wsel + t * K);
    route_log_call(m, T, h_logits, (int)E, (int)K, sel);
    /* bucket the (token, weight) pairs per expert, tokens ascending inside a bucket */
    int64_t nr = 0;
    for (int64_t e = 0; e < E; e++) {
        start[e] = nr;
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < K; j++)
                if (sel[t * K + j] == e) {
                    h_rows[nr] = (int32_t)t;
                    h_w[nr++] = wsel[t * K + j];
                }
    }
    start[E] = nr;
    for (int64_t t = 0; o->shared_ffn > 0 && t < T; t++) {
        h_rows[nr] = (int32_t)t;
        h_w[nr++] = 1.0f / (1.0f + expf(-h_logits[T * E + t]));
    }
    be->upload(be, d_rows, h_rows, (size_t)NR * sizeof(int32_t));
    be->upload(be, d_w, h_w, (size_t)NR * sizeof(float));
    be->zero(be, y, T * H);
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = start[e + 1] - start[e];
        if (n == 0) continue; /* unselected experts are never read */
        be->gather_rows(be, xe, x, d_rows + start[e], n, H);
        be->matmul(be, g, xe, n, &o->gate[e]);
        be->matmul(be, u, xe, n, &o->up[e]);
        be->silu_mul(be, g, g, u, n * o->ffn);
        be->matmul(be, ye, g, n, &o->down[e]);
        be->scatter_add_rows(be, y, ye, d_rows + start[e], d_w + start[e], n, H);
    }
    if (o->shared_ffn > 0) {
        be->matmul(be, g, x, T, &o->sh_gate);
        be->matmul(be, u, x, T, &o->sh_up);
        be->silu_mul(be, g, g, u, T * o->shared_ffn);
        be->matmul(be, ye, g, T, &o->sh_down);
        be->scatter_add_rows(be, y, ye, d_rows + start[E], d_w + start[E], T, H);
    }
done:
    free(h_logits);
    free(sel);
    free(wsel);
    free(h_rows);
    free(h_w);
    free(start);
    return st;
}
