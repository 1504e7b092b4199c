/* kv_codec.cuh — the KV row codecs of src/kv/kv_codec.h on the device, for the paged caches
 * (kv_paged.cu stores, attention_paged.cu reads): f32 / f16 / bf16 rows, per-group affine codes
 * (kv_quant.c) and TurboQuant Lloyd-Max codes of the Hadamard-rotated row (kv_turbo.c,
 * hadamard.c). Encoding repeats the CPU's arithmetic operation by operation with explicitly
 * rounded intrinsics (no FMA contraction, no fast-math division), so a row encodes to the same
 * bytes as kv_codec_encode; decoding gives the same floats as kv_codec_decode. Also the geometry
 * of a paged launch (kcu_paged_layer) shared by the store and attention kernels. Internal. */
#ifndef KILN_CUDA_KV_CODEC_CUH
#define KILN_CUDA_KV_CODEC_CUH

#ifndef KCU_HOST_EMU /* tests/emu/paged_attention_emulate.cc brings its own shims */
#include "backend/cuda/cuda_common.cuh"
#endif

extern "C" {
#include "kv/kv_codec.h"
}

/* One codec (kv_codec) as kernel parameters. */
typedef struct kcu_codec {
    int kind;   /* kv_codec_kind */
    int bits;   /* AFFINE / LLOYD */
    int group;  /* elements per scale group */
    int rotate; /* rows are Hadamard-rotated before encoding */
    int rec;    /* bytes of one encoded row */
    float centroid[1 << KILN_LM_MAX_BITS];
    float boundary[(1 << KILN_LM_MAX_BITS) - 1];
} kcu_codec;

/* One attention layer of a device pool: where its blocks are and how its rows are stored. A block
 * holds block_tokens tokens: K records [block_tokens][n_kv_heads] then, at v_offset, V records. */
typedef struct kcu_paged_layer {
    uint8_t *data; /* the pool's blocks */
    int64_t block_bytes;
    int64_t v_offset;
    int block_tokens;
    int table_stride; /* n_layers: block id of logical block b is table[b * stride + layer] */
    int layer;
    int n_kv_heads, head_dim, v_head_dim, window;
    kcu_codec k, v;
} kcu_paged_layer;

/* Start of the record of (position pos, kv head h) of K (is_v false) or V; NULL when the block
 * is gone (a sliding window dropped it). */
__device__ __forceinline__ uint8_t *kcu_paged_rec(const kcu_paged_layer &L, const int32_t *table,
                                                  int pos, int h, bool is_v) {
    int32_t id = table[(int64_t)(pos / L.block_tokens) * L.table_stride + L.layer];
    if (id < 0) return NULL;
    int64_t slot = (int64_t)(pos % L.block_tokens) * L.n_kv_heads + h;
    return L.data + (int64_t)id * L.block_bytes +
           (is_v ? L.v_offset + slot * L.v.rec : slot * L.k.rec);
}

/* 16-bit fields of a record: one 16-bit access where the field is at an even address (plain
 * f16/bf16 rows, scales), two byte accesses otherwise (a group of an odd byte count). (All were
 * byte stores until 2026-12-03; on the H200 the plain f16/bf16 paged records then held only
 * their high bytes.) */
__device__ __forceinline__ uint16_t kcu_rd16(const uint8_t *p) {
    if (((uintptr_t)p & 1) == 0) return *(const uint16_t *)p;
    return (uint16_t)(p[0] | (p[1] << 8));
}
__device__ __forceinline__ void kcu_wr16(uint8_t *p, uint16_t v) {
    if (((uintptr_t)p & 1) == 0) {
        *(uint16_t *)p = v;
        return;
    }
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}
__device__ __forceinline__ uint16_t kcu_f32_to_f16_bits(float x) {
    return __half_as_ushort(__float2half_rn(x));
}

/* Code j (bits wide) of a group's LSB-first bit stream of gbytes bytes (kiln_unpack_bits). */
__device__ __forceinline__ unsigned kcu_unpack_code(const uint8_t *codes, int j, int bits,
                                                    int gbytes) {
    if (bits == 8) return codes[j];
    int bit = j * bits, byte = bit >> 3;
    unsigned w = codes[byte];
    if (byte + 1 < gbytes) w |= (unsigned)codes[byte + 1] << 8;
    return (w >> (bit & 7)) & ((1u << bits) - 1u);
}

/* Element d of an encoded row of dim elements (kv_codec_decode; rotated basis if c.rotate). */
__device__ __forceinline__ float kcu_codec_elem(const kcu_codec &c, const uint8_t *rec, int dim,
                                                int d) {
    switch (c.kind) {
    case KV_CODEC_F32: {
        float x;
        memcpy(&x, rec + 4 * (int64_t)d, 4);
        return x;
    }
    case KV_CODEC_F16:
        return kcu_f16(kcu_rd16(rec + 2 * (int64_t)d));
    case KV_CODEC_BF16:
        return kcu_bf16(kcu_rd16(rec + 2 * (int64_t)d));
    case KV_CODEC_AFFINE: {
        const int g = d / c.group, i = d - g * c.group, ng = dim / c.group;
        const int gbytes = (c.group * c.bits + 7) / 8;
        float s = kcu_f16(kcu_rd16(rec + 4 * g)), b = kcu_f16(kcu_rd16(rec + 4 * g + 2));
        unsigned q =
            kcu_unpack_code(rec + (int64_t)ng * 4 + (int64_t)g * gbytes, i, c.bits, gbytes);
        return __fadd_rn(__fmul_rn(s, (float)q), b);
    }
    default: { /* KV_CODEC_LLOYD */
        const int g = d / c.group, i = d - g * c.group, ng = dim / c.group;
        const int gbytes = (c.group * c.bits + 7) / 8;
        float r = kcu_f16(kcu_rd16(rec + 2 * g));
        unsigned q =
            kcu_unpack_code(rec + (int64_t)ng * 2 + (int64_t)g * gbytes, i, c.bits, gbytes);
        return __fmul_rn(r, c.centroid[q]);
    }
    }
}

/* Elements lane, lane + 32, ... of an encoded row of dim elements into dst[0..dim), by one lane of
 * a warp (the 32 lanes together decode the row): the same floats as kcu_codec_elem, with each
 * group's scale located once instead of once per element. rec NULL (a dropped block): zeros. */
__device__ __forceinline__ void kcu_codec_row_lane(const kcu_codec &c, const uint8_t *rec, int dim,
                                                   int lane, float *dst) {
    if (!rec) {
        for (int d = lane; d < dim; d += 32) dst[d] = 0.0f;
        return;
    }
    switch (c.kind) {
    case KV_CODEC_F32:
        for (int d = lane; d < dim; d += 32) memcpy(&dst[d], rec + 4 * (int64_t)d, 4);
        return;
    case KV_CODEC_F16:
        for (int d = lane; d < dim; d += 32) dst[d] = kcu_f16(kcu_rd16(rec + 2 * (int64_t)d));
        return;
    case KV_CODEC_BF16:
        for (int d = lane; d < dim; d += 32) dst[d] = kcu_bf16(kcu_rd16(rec + 2 * (int64_t)d));
        return;
    case KV_CODEC_AFFINE: {
        const int G = c.group, ng = dim / G, gbytes = (G * c.bits + 7) / 8;
        const uint8_t *codes = rec + (int64_t)ng * 4;
        for (int g = 0; g < ng; g++) {
            const float s = kcu_f16(kcu_rd16(rec + 4 * g)), b = kcu_f16(kcu_rd16(rec + 4 * g + 2));
            const uint8_t *cg = codes + (int64_t)g * gbytes;
            for (int i = lane; i < G; i += 32)
                dst[g * G + i] =
                    __fadd_rn(__fmul_rn(s, (float)kcu_unpack_code(cg, i, c.bits, gbytes)), b);
        }
        return;
    }
    default: { /* KV_CODEC_LLOYD */
        const int G = c.group, ng = dim / G, gbytes = (G * c.bits + 7) / 8;
        const uint8_t *codes = rec + (int64_t)ng * 2;
        for (int g = 0; g < ng; g++) {
            const float r = kcu_f16(kcu_rd16(rec + 2 * g));
            const uint8_t *cg = codes + (int64_t)g * gbytes;
            for (int i = lane; i < G; i += 32)
                dst[g * G + i] = __fmul_rn(r, c.centroid[kcu_unpack_code(cg, i, c.bits, gbytes)]);
        }
        return;
    }
    }
}

/* kiln_hadamard_sign: splitmix64 of the index, +1 or -1. */
__device__ __forceinline__ float kcu_hadamard_sign(int i) {
    uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull + 0x6a09e667f3bcc909ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (z & 1) ? -1.0f : 1.0f;
}

/* In-place unnormalized FWHT of `rows` rows of n floats (n a power of two) in shared memory, by
 * the whole block; the butterflies are kiln_fwht's, so the result is the same bits. Begins and
 * ends with __syncthreads (every thread of the block must call it). */
__device__ __forceinline__ void kcu_fwht_rows(float *x, int rows, int n) {
    const int half = n / 2;
    for (int h = 1; h < n; h *= 2) {
        __syncthreads();
        for (int i = threadIdx.x; i < rows * half; i += blockDim.x) {
            int r = i / half, k = i - r * half;
            int j = (k / h) * 2 * h + (k % h);
            float *xr = x + (int64_t)r * n;
            float a = xr[j], b = xr[j + h];
            xr[j] = __fadd_rn(a, b);
            xr[j + h] = __fsub_rn(a, b);
        }
    }
    __syncthreads();
}

/* 1 / sqrt(n) rounded as the CPU's 1.0f / sqrtf((float)n). */
__device__ __forceinline__ float kcu_inv_sqrt_rn(int n) {
    return __fdiv_rn(1.0f, __fsqrt_rn((float)n));
}

/* Appends a code to an LSB-first bit stream (kiln_pack_bits), writing whole bytes to out. */
struct kcu_bit_writer {
    uint32_t acc;
    int have;
    int o;
};
__device__ __forceinline__ void kcu_put_code(kcu_bit_writer &w, unsigned code, int bits,
                                             uint8_t *out) {
    w.acc |= (code & ((1u << bits) - 1u)) << w.have;
    w.have += bits;
    while (w.have >= 8) {
        out[w.o++] = (uint8_t)w.acc;
        w.acc >>= 8;
        w.have -= 8;
    }
}
__device__ __forceinline__ void kcu_flush_codes(kcu_bit_writer &w, uint8_t *out) {
    if (w.have > 0) out[w.o] = (uint8_t)w.acc;
}

/* kiln_lloyd_max_encode: index of the first boundary >= x, by the same bisection. */
__device__ __forceinline__ int kcu_lloyd_code(const kcu_codec &c, float x) {
    int lo = 0, hi = (1 << c.bits) - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (x > c.boundary[mid])
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Encodes group g of x (already rotated when the codec rotates) into the record rec of a dim-wide
 * row: kv_affine_encode / kv_lloyd_encode for one group, by one thread. */
__device__ __forceinline__ void kcu_encode_group(const kcu_codec &c, const float *x, int dim, int g,
                                                 uint8_t *rec) {
    const int G = c.group, ng = dim / G, gbytes = (G * c.bits + 7) / 8;
    const float *xg = x + (int64_t)g * G;
    kcu_bit_writer w = {0u, 0, 0};
    if (c.kind == KV_CODEC_AFFINE) {
        const float qmax = (float)((1 << c.bits) - 1);
        float lo = xg[0], hi = xg[0];
        for (int i = 1; i < G; i++) {
            lo = xg[i] < lo ? xg[i] : lo;
            hi = xg[i] > hi ? xg[i] : hi;
        }
        uint16_t s16 = kcu_f32_to_f16_bits(__fdiv_rn(__fsub_rn(hi, lo), qmax));
        uint16_t b16 = kcu_f32_to_f16_bits(lo);
        float s = kcu_f16(s16), b = kcu_f16(b16);
        float inv = s > 0 ? __frcp_rn(s) : 0.0f;
        uint8_t *packed = rec + (int64_t)ng * 4 + (int64_t)g * gbytes;
        for (int i = 0; i < G; i++) {
            float q = rintf(__fmul_rn(__fsub_rn(xg[i], b), inv));
            unsigned code = (unsigned)(q < 0 ? 0.0f : q > qmax ? qmax : q);
            kcu_put_code(w, code, c.bits, packed);
        }
        kcu_flush_codes(w, packed);
        kcu_wr16(rec + 4 * g, s16);
        kcu_wr16(rec + 4 * g + 2, b16);
        return;
    }
    /* KV_CODEC_LLOYD: RMS scale, nearest centroid, then the least-squares scale */
    double ss = 0;
    for (int i = 0; i < G; i++) ss = __dadd_rn(ss, __dmul_rn((double)xg[i], (double)xg[i]));
    uint16_t r16 = kcu_f32_to_f16_bits(__double2float_rn(__dsqrt_rn(__ddiv_rn(ss, (double)G))));
    float r = kcu_f16(r16);
    float inv = r > 0 ? __frcp_rn(r) : 0.0f;
    double xc = 0, cc = 0;
    uint8_t *packed = rec + (int64_t)ng * 2 + (int64_t)g * gbytes;
    for (int i = 0; i < G; i++) {
        int code = kcu_lloyd_code(c, __fmul_rn(xg[i], inv));
        double cd = (double)c.centroid[code];
        xc = __dadd_rn(xc, __dmul_rn((double)xg[i], cd));
        cc = __dadd_rn(cc, __dmul_rn(cd, cd));
        kcu_put_code(w, (unsigned)code, c.bits, packed);
    }
    kcu_flush_codes(w, packed);
    if (cc > 0) r16 = kcu_f32_to_f16_bits(__double2float_rn(__ddiv_rn(xc, cc)));
    kcu_wr16(rec + 2 * g, r16);
}

#endif
