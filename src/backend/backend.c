/* backend.c — picks the backend for a device; the decode-layer fusions composed of plain ops. */
#include "backend/backend.h"

#include <stdlib.h>

#include "util/status.h"

#include <string.h>

#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#endif

/* Settings every backend takes from the environment when it is made (read once, not per op). */
static void apply_env(kiln_backend *be) {
    const char *e = getenv("KILN_MOE_DEVICE_TOKENS");
    if (e && *e) {
        be->moe_device_max_tokens = atoi(e) > 0 ? atoi(e) : 0;
        be->moe_device_tokens_set = true;
    }
}

kiln_status kiln_backend_new(kiln_device device, int n_threads, kiln_backend **out) {
    *out = NULL;
    kiln_status st;
    switch (device) {
    case KILN_DEVICE_CPU:
        st = kiln_backend_cpu_new(n_threads, out);
        break;
    case KILN_DEVICE_CUDA:
#ifdef KILN_HAVE_CUDA
        st = kiln_backend_cuda_new(n_threads, out);
        break;
#else
        return kiln_error(
            KILN_ERR_UNSUPPORTED,
            "--device cuda: this kiln was built without CUDA (no nvcc at build time)");
#endif
    default:
        return kiln_error(KILN_ERR_INVALID_ARG, "unknown device %d", (int)device);
    }
    if (st == KILN_OK) apply_env(*out);
    return st;
}

kiln_status kiln_set_matmul_mode(const char *mode) {
    kiln_status st = kiln_set_cpu_matmul_mode(mode);
    if (st != KILN_OK) return st;
#ifdef KILN_HAVE_CUDA
    kiln_cuda_set_gemm_split(strcmp(mode, "fast") != 0);
#endif
    return KILN_OK;
}

void kiln_backend_matmul_norm_composed(kiln_backend *be, int count, float *const *ys,
                                       const float *x, float *h, int64_t n,
                                       const kiln_matrix *const *ws, const float *norm_w, float eps,
                                       bool plus_one) {
    be->rmsnorm(be, h, x, norm_w, n, ws[0]->cols, eps, plus_one);
    if (count == 1)
        be->matmul(be, ys[0], h, n, ws[0]);
    else
        be->matmul_multi(be, count, ys, h, n, ws);
}

void kiln_backend_matmul_add_composed(kiln_backend *be, float *y, const float *x, float *tmp,
                                      int64_t n, const kiln_matrix *w) {
    be->matmul(be, tmp, x, n, w);
    be->add(be, y, y, tmp, n * w->rows);
}

void kiln_backend_matmul_norm_glu_composed(kiln_backend *be, float *out, const float *x, float *h,
                                           float *up, int64_t n, const kiln_matrix *wg,
                                           const kiln_matrix *wu, const float *norm_w, float eps,
                                           bool plus_one, kiln_glu_act act) {
    be->rmsnorm(be, h, x, norm_w, n, wg->cols, eps, plus_one);
    float *const ys[2] = {out, up};
    const kiln_matrix *const ws[2] = {wg, wu};
    be->matmul_multi(be, 2, ys, h, n, ws);
    if (act == KILN_GLU_GELU_TANH)
        be->gelu_tanh_mul(be, out, out, up, n * wg->rows);
    else
        be->silu_mul(be, out, out, up, n * wg->rows);
}
