/* elementwise.cu — the pointwise ops: silu_mul (SwiGLU), gelu_tanh_mul (GeGLU), add, scale and
 * softcap (Gemma's tanh logit soft-capping).
 * Grid-stride loops over f32; outputs may alias an input (each element is read before written). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

__global__ void k_silu_mul(float *y, const float *g, const float *u, int64_t n) {
    KCU_PDL_ENTER();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float a = g[i];
        y[i] = a / (1.0f + __expf(-a)) * u[i];
    }
}

__global__ void k_gelu_tanh_mul(float *y, const float *g, const float *u, int64_t n) {
    KCU_PDL_ENTER();
    const float k0 = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float a = g[i];
        float t = kcu_tanh(k0 * (a + 0.044715f * a * a * a));
        y[i] = 0.5f * a * (1.0f + t) * u[i];
    }
}

__global__ void k_add(float *y, const float *a, const float *b, int64_t n) {
    KCU_PDL_ENTER();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

__global__ void k_scale(float *x, float s, int64_t n) {
    KCU_PDL_ENTER();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

/* In double: this file builds with --use_fast_math, which turns tanhf into tanh.approx.f32
 * (~2^-11 relative error) and x / cap into an approximate division; the double tanh is left
 * exact, so the capped logits stay within an ulp or so of the CPU's cap * tanhf(x / cap). */
__global__ void k_softcap(float *x, float cap, int64_t n) {
    KCU_PDL_ENTER();
    const double c = cap;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = (float)(c * tanh((double)x[i] / c));
}

extern "C" void kcu_silu_mul(kiln_backend *be, float *y, const float *gate, const float *up,
                             int64_t n) {
    kcu_state *st = kcu_st(be);
    if (n <= 0) return;
    KCU_LAUNCH(st, k_silu_mul, kcu_blocks(n, 256, 65536), 256, 0, y, gate, up, n);
    KCU_LAUNCHED(st);
}

extern "C" void kcu_gelu_tanh_mul(kiln_backend *be, float *y, const float *gate, const float *up,
                                  int64_t n) {
    kcu_state *st = kcu_st(be);
    if (n <= 0) return;
    KCU_LAUNCH(st, k_gelu_tanh_mul, kcu_blocks(n, 256, 65536), 256, 0, y, gate, up, n);
    KCU_LAUNCHED(st);
}

extern "C" void kcu_add(kiln_backend *be, float *y, const float *a, const float *b, int64_t n) {
    kcu_state *st = kcu_st(be);
    if (n <= 0) return;
    KCU_LAUNCH(st, k_add, kcu_blocks(n, 256, 65536), 256, 0, y, a, b, n);
    KCU_LAUNCHED(st);
}

extern "C" void kcu_scale(kiln_backend *be, float *x, float s, int64_t n) {
    kcu_state *st = kcu_st(be);
    if (n <= 0) return;
    KCU_LAUNCH(st, k_scale, kcu_blocks(n, 256, 65536), 256, 0, x, s, n);
    KCU_LAUNCHED(st);
}

extern "C" void kcu_softcap(kiln_backend *be, float *x, float cap, int64_t n) {
    kcu_state *st = kcu_st(be);
    if (n <= 0) return;
    KCU_LAUNCH(st, k_softcap, kcu_blocks(n, 256, 65536), 256, 0, x, cap, n);
    KCU_LAUNCHED(st);
}
