/* attention_paged_decode.cuh — decode attention over a paged device KV cache in one launch, the
 * paged twin of attention_decode.cuh: one block per (KV head, query heads of its group, sequence,
 * key split), its 16 warps taking KB keys a turn, lane l holding dims 4l..4l+3 (+ 128, ...) of q,
 * of each key's K and V rows and of the output.
 *
 * A turn looks up its keys' block-table entries, then issues every raw load of its records (the
 * lane's 4 dims: 16 bytes of an f32 row, 8 of an f16 / bf16 row, or the 32-bit word(s) holding
 * its 4 codes plus the word holding its group's scale) before decoding any, so a warp keeps its
 * K/V bytes in flight instead of decoding element by element into shared memory as
 * attention_paged.cu's k_paged_attn does. Decoding gives kcu_codec_elem's floats (the same
 * rounded operations). Keys rotated by the Hadamard transform (turbo ...:rotk) are scored against
 * the rotated query (rotated in shared memory first); rotated values stay in the rotated basis
 * (attention_paged.cu's k_paged_unrotate runs after). Splits and their merge as in
 * attention_decode.cuh: each split writes (m, l, acc) partials and the last to arrive merges.
 *
 * Records are read as aligned 32-bit words or wider: pdec_class says which layouts qualify
 * (16-byte aligned f32 rows, 8-byte f16 / bf16 rows, quantized rows whose record and code stream
 * start on 4 bytes); the others keep k_paged_attn. tests/emu/paged_attention_emulate.cc compiles
 * this file on the CPU with emulated threads. */
#ifndef KILN_CUDA_ATTENTION_PAGED_DECODE_CUH
#define KILN_CUDA_ATTENTION_PAGED_DECODE_CUH

#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/kv_codec.cuh"

/* How a record's lane slice is loaded: K and V must share one. */
enum { PDEC_F32 = 0, PDEC_F16 = 1, PDEC_QUANT = 2 };

struct pdec_seq {
    const int32_t *table; /* the sequence's device block table */
    int pos0, t0;         /* the query's position (unless positions), its row in q / out */
};

/* Kernel parameters. */
struct pdec_args {
    kcu_paged_layer L;
    const float *q;           /* [rows, n_heads*hd] */
    float *out;               /* [rows, n_heads*vhd] */
    const int32_t *positions; /* device positions by row (a recorded step), or NULL: pos0 */
    int n_heads, group, nsub;
    float scale, softcap;
    int splits, kps;    /* split z takes keys [kbeg + z*kps, + kps) */
    float *part_o;      /* splits > 1: [sequences, n_heads, splits, vhd] */
    float *part_ml;     /* [sequences, n_heads, splits, 2] */
    unsigned *counters; /* [sequences * gridDim.x], zero between launches */
    pdec_seq s[ATTS_MAX_SEQ];
};

/* The load class both codecs of L take, or -1 (k_paged_attn then): plain rows of one width, or
 * affine / Lloyd-Max codes whose bit stream and scales sit on 4-byte boundaries. */
static inline int pdec_codec_class(const kcu_codec &c, int dim) {
    switch (c.kind) {
    case KV_CODEC_F32:
        return c.rec % 16 == 0 ? PDEC_F32 : -1;
    case KV_CODEC_F16:
    case KV_CODEC_BF16:
        return c.rec % 8 == 0 ? PDEC_F16 : -1;
    default: {
        if (c.group < 4 || c.group % 4 || dim % c.group || c.bits < 1 || c.bits > 8) return -1;
        const int ng = dim / c.group, head = ng * (c.kind == KV_CODEC_AFFINE ? 4 : 2);
        return c.rec % 4 == 0 && head % 4 == 0 ? PDEC_QUANT : -1;
    }
    }
}
static inline int pdec_class(const kcu_paged_layer &L) {
    const int k = pdec_codec_class(L.k, L.head_dim), v = pdec_codec_class(L.v, L.v_head_dim);
    const int align = k == PDEC_F32 ? 16 : k == PDEC_F16 ? 8 : 4;
    if (k < 0 || k != v || ((uintptr_t)L.data % 16) || L.block_bytes % align ||
        L.v_offset % align || !atts_applies(1, L.head_dim, L.v_head_dim))
        return -1;
    return k;
}

/* The raw words of a lane's 4 elements (dims d0..d0+3) of a record: w[0..3] (f32 rows), w[0..1]
 * (f16 / bf16 rows), or the code words w[0], w[1] and the scale word w[2] (quantized). Zeros for
 * a dropped block or a lane past the row. */
template <int CLS>
__device__ __forceinline__ void pdec_load(const kcu_codec &c, const uint8_t *rec, int dim, int d0,
                                          uint32_t w[4]) {
    w[0] = w[1] = w[2] = w[3] = 0u;
    if (!rec || d0 >= dim) return;
    if constexpr (CLS == PDEC_F32) {
        const uint4 u = kcu_ld((const uint4 *)(rec + 4 * (int64_t)d0));
        w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
    } else if constexpr (CLS == PDEC_F16) {
        const uint2 u = kcu_ld((const uint2 *)(rec + 2 * (int64_t)d0));
        w[0] = u.x, w[1] = u.y;
    } else {
        const bool affine = c.kind == KV_CODEC_AFFINE;
        const int g = d0 / c.group, ng = dim / c.group;
        const uint32_t *codes = (const uint32_t *)(rec + ng * (affine ? 4 : 2));
        const int bit = d0 * c.bits; /* the stream is contiguous: a group is G*bits/8 bytes */
        w[0] = kcu_ld(codes + (bit >> 5));
        if ((bit & 31) + 4 * c.bits > 32) w[1] = kcu_ld(codes + (bit >> 5) + 1);
        w[2] = kcu_ld((const uint32_t *)(rec + (affine ? 4 * g : (2 * g & ~3))));
    }
}

/* The 4 floats of pdec_load's words (kcu_codec_elem's values). */
template <int CLS>
__device__ __forceinline__ void pdec_decode(const kcu_codec &c, int dim, int d0,
                                            const uint32_t w[4], float v[4]) {
    if constexpr (CLS == PDEC_F32) {
#pragma unroll
        for (int e = 0; e < 4; e++) v[e] = __uint_as_float(w[e]);
    } else if constexpr (CLS == PDEC_F16) {
        kcu_kv_unpack2(w[0], c.kind == KV_CODEC_BF16 ? KILN_DT_BF16 : KILN_DT_F16, v);
        kcu_kv_unpack2(w[1], c.kind == KV_CODEC_BF16 ? KILN_DT_BF16 : KILN_DT_F16, v + 2);
    } else {
        if (d0 >= dim) {
            v[0] = v[1] = v[2] = v[3] = 0.0f;
            return;
        }
        const int sh = (d0 * c.bits) & 31;
        const uint64_t stream = (((uint64_t)w[1] << 32) | w[0]) >> sh;
        const unsigned mask = (1u << c.bits) - 1u;
        if (c.kind == KV_CODEC_AFFINE) {
            const float s = kcu_f16((uint16_t)(w[2] & 0xffffu)),
                        b = kcu_f16((uint16_t)(w[2] >> 16));
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const unsigned q = (unsigned)(stream >> (e * c.bits)) & mask;
                v[e] = __fadd_rn(__fmul_rn(s, (float)q), b);
            }
        } else {
            const int g = d0 / c.group;
            const float r = kcu_f16((uint16_t)((g & 1) ? w[2] >> 16 : w[2] & 0xffffu));
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const unsigned q = (unsigned)(stream >> (e * c.bits)) & mask;
                v[e] = __fmul_rn(r, c.centroid[q]);
            }
        }
    }
}

/* GM: query heads per block rounded up (1, 2, 4, 8); CH: 128-dim chunks per lane; KB: keys per
 * warp per turn; CLS: the records' load class (pdec_class).
 * grid (n_kv_heads * nsub, sequences, splits), ATTS_WARPS * 32 threads; dynamic shared memory
 * pdec_smem_bytes: the rotated q rows first (rotated keys), then as attention_decode.cuh's. */
template <int GM, int CH, int KB, int CLS>
__global__ void __launch_bounds__(ATTS_WARPS * 32)
    k_paged_decode(const __grid_constant__ pdec_args A) {
    KCU_PDL_ENTER();
    const kcu_paged_layer &L = A.L;
    const pdec_seq &S = A.s[blockIdx.y];
    const int kvh = (int)blockIdx.x / A.nsub, h0 = ((int)blockIdx.x - kvh * A.nsub) * GM;
    const int G = A.group - h0 < GM ? A.group - h0 : GM, hd = L.head_dim, vhd = L.v_head_dim;
    const int head0 = kvh * A.group + h0;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pos = A.positions ? A.positions[S.t0] : S.pos0;
    const int kbeg = L.window > 0 ? max(0, pos - L.window + 1) : 0;
    const int lo = kbeg + (int)blockIdx.z * A.kps;
    const int kend = A.splits > 1 ? min(pos + 1, lo + A.kps) : pos + 1;
    ATTS_SMEM(sm);
    /* the group's q rows, scaled (and rotated like the keys): the lane's dims */
    const float *qrow = A.q + ((int64_t)S.t0 * A.n_heads + head0) * hd; /* [G][hd] */
    float q[GM][CH][4];
    if (L.k.rotate) { /* q -> H.D.q / sqrt(hd) (kiln_hadamard_rotate), then the scale */
        for (int i = threadIdx.x; i < G * hd; i += blockDim.x)
            sm[i] = qrow[i] * kcu_hadamard_sign(i % hd);
        kcu_fwht_rows(sm, G, hd);
        const float r = kcu_inv_sqrt_rn(hd);
        for (int i = threadIdx.x; i < G * hd; i += blockDim.x)
            sm[i] = __fmul_rn(sm[i], r) * A.scale;
        __syncthreads();
    }
#pragma unroll
    for (int g = 0; g < GM; g++)
#pragma unroll
        for (int c = 0; c < CH; c++) {
            const int d0 = 4 * lane + 128 * c;
#pragma unroll
            for (int e = 0; e < 4; e++)
                q[g][c][e] = g >= G || d0 >= hd ? 0.0f
                             : L.k.rotate       ? sm[g * hd + d0 + e]
                                                : qrow[g * hd + d0 + e] * A.scale;
        }
    float m[GM], l[GM], acc[GM][CH][4];
    atts_start<GM, CH>(m, l, acc);
    for (int j0 = lo + KB * warp; j0 < kend; j0 += KB * ATTS_WARPS) {
        const uint8_t *kr[KB], *vr[KB];
#pragma unroll
        for (int u = 0; u < KB; u++) {
            const bool in = j0 + u < kend;
            kr[u] = in ? kcu_paged_rec(L, S.table, j0 + u, kvh, false) : NULL;
            vr[u] = in ? kcu_paged_rec(L, S.table, j0 + u, kvh, true) : NULL;
        }
        uint32_t kw[KB][CH][4], vw[KB][CH][4];
#pragma unroll
        for (int u = 0; u < KB; u++)
#pragma unroll
            for (int c = 0; c < CH; c++) {
                pdec_load<CLS>(L.k, kr[u], hd, 4 * lane + 128 * c, kw[u][c]);
                pdec_load<CLS>(L.v, vr[u], vhd, 4 * lane + 128 * c, vw[u][c]);
            }
        float kx[KB][CH][4], vx[KB][CH][4];
#pragma unroll
        for (int u = 0; u < KB; u++)
#pragma unroll
            for (int c = 0; c < CH; c++) {
                pdec_decode<CLS>(L.k, hd, 4 * lane + 128 * c, kw[u][c], kx[u][c]);
                pdec_decode<CLS>(L.v, vhd, 4 * lane + 128 * c, vw[u][c], vx[u][c]);
            }
        /* past the split, or in a block a window dropped (its keys are outside the window) */
        bool ok[KB];
#pragma unroll
        for (int u = 0; u < KB; u++) ok[u] = j0 + u < kend && kr[u];
        atts_turn<GM, CH, KB>(q, kx, vx, ok, G, A.softcap, m, l, acc);
    }
    atts_finish<GM, CH>(sm, G, vhd, m, l, acc, (int64_t)S.t0 * A.n_heads + head0, A.out, A.splits,
                        A.part_o, A.part_ml, A.counters);
}

/* Dynamic shared memory of a launch: the rotated q rows or the merge's. */
static inline size_t pdec_smem_bytes(const pdec_args &A) {
    const int hpb = atts_heads_per_block(A.group, A.L.head_dim, A.L.v_head_dim);
    const size_t merge = atts_smem_bytes(hpb, A.L.v_head_dim);
    const size_t qrows = sizeof(float) * (size_t)hpb * A.L.head_dim;
    return merge > qrows ? merge : qrows;
}

#endif
