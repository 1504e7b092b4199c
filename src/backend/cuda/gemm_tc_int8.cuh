/* gemm_tc_int8.cuh — the int8 tensor-core variant of gemm_tc.cu's GEMM on MLX affine 4/8-bit
 * codes (included by gemm_tc.cu; opt-in, KILN_CUDA_TC_INT8=1 or kiln_cuda_set_tc_int8): x becomes
 * signed-byte digits once per call and the MMA is mma.sync m16n8k32 u8 x s8 -> s32, which takes
 * the codes as they are stored (bytes; nibbles after one mask) and sums exactly in integers.
 *
 * x per token and quantization group g (32/64/128 columns), from its max |x| m:
 *  - exact mode (3 digits): E = 2^(e-22) with m < 2^e, X = rint(x / E) (|X| <= 2^22, so x = E X
 *    within E / 2 < 2^-22 m), X = d0 + 256 d1 + 65536 d2 with signed-byte digits (|d2| <= 64);
 *  - fast mode (1 digit, --fast-math): E = m / 127, X = rint(x / E) in [-127, 127] (llama.cpp's
 *    Q8_1 steps, ~1e-3 relative).
 * Each digit plane gets its own MMA into its own s32 fragment D_p (|D_p| <= 128 * 255 * 128 <
 * 2^22, so 256 D1 + D0 stays inside int32); at the group's end
 *    acc += scale[r,g] * (E[t,g] * (65536 D2 + 256 D1 + D0)) + bias[r,g] * xsum[t,g]
 * (xsum: the f32 sum of E X over the group), which is sum_j (scale q_j + bias) x_j with each
 * x_j within E / 2. The epilogue and split-K reduce are gemm_tc.cu's (k_tc_prep_i8 writes 1 / sigma
 * = 1).
 *
 * k order and tiles as the f16 kernel: a thread (g = lane/4, t = lane%4) owns, in a span of SS/2
 * k32 steps (one group or 64 columns), the 8*SS/2 contiguous columns [8(SS/2)t, 8(SS/2)(t+1));
 * step s takes columns 8s..8s+7 of that run: A regs 0/1 (rows g / g+8) the first four codes, 2/3
 * the last four; B regs 0/1 the matching digits. 4-bit words split into even and odd nibbles
 * (w & 0x0F0F0F0F, (w >> 4) & 0x0F0F0F0F), so k_tc_prep_i8 stores each 8-column run of digits
 * as columns 0,2,4,6,1,3,5,7 for 4-bit weights. The W tile and its shared-memory layout are the
 * f16 kernel's; the x tile holds DIG planes of 64 bytes per token (global layout [n_pad]
 * [cols_pad / 64][DIG][64], so a token's chunk is one contiguous copy). */

/* x tile row stride (bytes): conflict-free B loads (SS = 4: 16-byte loads, 8 lanes = 2 rows a
 * phase, stride = 64 mod 128; SS = 2: 8-byte loads, 16 lanes = 4 rows, stride = 32 or 96 mod 128)
 */
template <int DIG, int SS> struct tc_i8_x {
    static constexpr int XS = SS == 4 ? DIG * 64 : DIG * 64 + 32;
};

template <int MODE, int SS, int DIG, int BN, int STAGES> struct tc_layout_i8 {
    static constexpr int W = TC_BM * tc_geom<MODE, SS>::WS;
    static constexpr int X = BN * tc_i8_x<DIG, SS>::XS;
    static constexpr int STAGE = W + X;
    static constexpr size_t bytes = (size_t)STAGES * STAGE;
};

#ifndef TC_HOST_EMU
/* d += a b (ZERO: d = a b, a group's first step: no reset of d), m16n8k32, a: u8 codes, b: s8
 * digits, s32 accumulators */
template <bool ZERO>
__device__ __forceinline__ void tc_mma_i8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
    if (ZERO)
        asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
            : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
    else
        asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

template <int MODE, int SS, int DIG, int BN, int WM, int WN, int STAGES>
__global__ void __launch_bounds__(TC_THREADS) k_tc_gemm_i8(const __grid_constant__ tc_args A) {
    using G = tc_geom<MODE, SS>;
    using SM = tc_layout_i8<MODE, SS, DIG, BN, STAGES>;
    constexpr int XS = tc_i8_x<DIG, SS>::XS;
    constexpr int MT = TC_BM / 16 / WM; /* m16 tiles per warp */
    constexpr int NT = BN / 8 / WN;     /* n8 tiles per warp */
    constexpr int NS = SS / 2;          /* k32 steps per span */
    static_assert(MODE == TC_Q4 || MODE == TC_Q8, "codes only");
    static_assert(WM * WN == TC_THREADS / 32 && MT >= 1 && NT >= 1, "warp layout");
    static_assert(SS == 2 || SS == 4, "span");
    static_assert(DIG == 1 || DIG == 3, "digits");

    const tc_block B = tc_block_of(A, BN);
    if (B.tok0 >= B.tok_end) return; /* expert mode: no token tile */
    const int tok0 = B.tok0, kc0 = B.kc0, nk = B.nk, nchunks = A.cols_pad / TC_BK;
    char *smem = (char *)tc_sm_raw;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    auto issue_w = [&](int kc, int slot) {
        tc_issue_w<MODE, SS>(smem + slot * SM::STAGE, B, A.cols, kc);
    };
    /* x digits of chunk kc: DIG * 64 contiguous bytes a token, inside the padded buffer */
    auto issue_x = [&](int kc, int slot) {
        char *dst = smem + slot * SM::STAGE + SM::W;
        constexpr int SEGS = DIG * 4;
        for (int i = tid; i < BN * SEGS; i += TC_THREADS) {
            const int tk = i / SEGS, sg = i % SEGS;
            const int8_t *src = A.xd + ((int64_t)(tok0 + tk) * nchunks + kc) * (DIG * 64) + sg * 16;
            tc_cp16(dst + tk * XS + sg * 16, src, 16);
        }
    };

    tc_pipeline_start<STAGES>(kc0, nk, issue_w, issue_x);

    const int wm = warp % WM, wn = warp / WM;
    const int g = lane >> 2, t = lane & 3;
    const int mrow = wm * MT * 16, ntok = wn * NT * 8;

    float acc[MT][NT][4];
    int accd[DIG][MT][NT][4]; /* the group's integer sums, one per digit plane (a block's chunks
                               * start on a group: its first span is fresh) */
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                acc[mi][ni][i] = 0.0f;
#pragma unroll
                for (int p = 0; p < DIG; p++) accd[p][mi][ni][i] = 0;
            }

    for (int it = 0; it < nk; it++) {
        tc_pipeline_next<STAGES>(it, kc0, nk, issue_w, issue_x);
        const char *Ws = smem + (it % STAGES) * SM::STAGE;
        const char *Xs = Ws + SM::W;
        const int c0 = (kc0 + it) * TC_BK;

#pragma unroll
        for (int sp = 0; sp < G::SPANS; sp++) {
            const int run = sp * 16 * SS + t * 4 * SS; /* the thread's first column in the chunk */
            const int cend = c0 + (sp + 1) * 16 * SS;
            const bool fold = (cend & (A.group - 1)) == 0;
            /* the span starts a group (always unless group 128, whose two 64-column spans are
             * two chunks): its first MMAs start the integer sums from zero */
            const bool fresh = SS == 2 || ((c0 + sp * 16 * SS) & (A.group - 1)) == 0;
            float fs[MT][2] = {}, fb[MT][2] = {}, fx[NT][2] = {}, fe[NT][2] = {};
            if (fold) {
                const int gi = cend / A.group - 1;
                tc_group_scales<MT>(fs, fb, A, B, mrow, g, gi);
                tc_token_groups<NT>(fx, A.xsum, A, tok0 + ntok, t, gi);
                tc_token_groups<NT>(fe, A.xe, A, tok0 + ntok, t, gi);
            }
            /* A fragments of every step of the span, both rows of every m tile: 4-bit, one
             * word (8 codes) a step; 8-bit, two */
            constexpr int AW = G::TB / 4;
            uint32_t araw[MT][2][AW], a[NS][MT][4];
            tc_load_codes<MODE, SS, MT, AW>(araw, Ws, mrow, g, run);
#pragma unroll
            for (int mi = 0; mi < MT; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int s = 0; s < NS; s++) {
                        if constexpr (MODE == TC_Q4) {
                            const uint32_t w = araw[mi][h][s];
                            a[s][mi][h] = w & 0x0F0F0F0Fu;            /* columns 0,2,4,6 */
                            a[s][mi][2 + h] = (w >> 4) & 0x0F0F0F0Fu; /* columns 1,3,5,7 */
                        } else {
                            a[s][mi][h] = araw[mi][h][2 * s];
                            a[s][mi][2 + h] = araw[mi][h][2 * s + 1];
                        }
                    }
                    /* digit planes one after another: B fragments of the span, then its MMAs */
#pragma unroll
            for (int p = 0; p < DIG; p++) {
                uint32_t b[NT][2 * NS];
#pragma unroll
                for (int ni = 0; ni < NT; ni++) {
                    const char *q = Xs + (ntok + 8 * ni + g) * XS + p * 64 + run;
                    if constexpr (NS == 1) {
                        const uint2 v = *(const uint2 *)q;
                        b[ni][0] = v.x, b[ni][1] = v.y;
                    } else {
                        const uint4 v = *(const uint4 *)q;
                        b[ni][0] = v.x, b[ni][1] = v.y, b[ni][2 * NS - 2] = v.z;
                        b[ni][2 * NS - 1] = v.w;
                    }
                }
#pragma unroll
                for (int s = 0; s < NS; s++)
#pragma unroll
                    for (int mi = 0; mi < MT; mi++)
#pragma unroll
                        for (int ni = 0; ni < NT; ni++) {
                            int(&d)[4] = accd[p][mi][ni];
                            if (s == 0 && fresh)
                                tc_mma_i8<true>(d, a[s][mi], b[ni][2 * s], b[ni][2 * s + 1]);
                            else
                                tc_mma_i8<false>(d, a[s][mi], b[ni][2 * s], b[ni][2 * s + 1]);
                        }
            }
            if (fold) {
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int ni = 0; ni < NT; ni++)
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            float d;
                            if constexpr (DIG == 3)
                                d = fmaf((float)accd[2][mi][ni][i], 65536.0f,
                                         (float)(accd[1][mi][ni][i] * 256 + accd[0][mi][ni][i]));
                            else
                                d = (float)accd[0][mi][ni][i];
                            acc[mi][ni][i] =
                                fmaf(fs[mi][i >> 1], d * fe[ni][i & 1],
                                     fmaf(fb[mi][i >> 1], fx[ni][i & 1], acc[mi][ni][i]));
                        }
            }
        }
    }
    tc_cp_wait<0>();
    tc_store<MT, NT>(A, B, acc, mrow, ntok, g, t); /* 1 / sigma = 1: the epilogue of gemm_tc.cu */
    tc_reduce_last(A, B, BN);
}

/* Slot of column j (0..7) of an 8-column run of digits: 4-bit weights store each run as columns
 * 0,2,4,6,1,3,5,7 (even nibbles, then odd), 8-bit ones as is. */
template <bool PERM> __device__ __forceinline__ int tc_i8_slot(int j) {
    return PERM ? ((j & 1) << 2) | (j >> 1) : j;
}

/* x -> digits, one block per token row of the padded buffers (rows past n: zero digits, E and
 * sums 0); each thread owns 8-column runs o = tid + 256 k, so a group's runs sit on 4/8/16
 * adjacent lanes and its max and sum are shuffles among them (fixed order: deterministic). With
 * norm, x is first RMS-normalized as k_tc_prep does. Dynamic shared memory: 8 floats. */
template <int DIG, bool PERM>
__global__ void __launch_bounds__(TC_THREADS) k_tc_prep_i8(const __grid_constant__ tc_prep_args P) {
    kcu_pdl_wait();
    kcu_pdl_trigger();
    float *red = (float *)tc_sm_raw;
    const int tok = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
    const int nrun = P.cols_pad / 8, ngp = P.cols_pad / P.group;
    int8_t *xd = P.xd + (int64_t)tok * P.cols_pad * DIG;
    if (tok >= P.n) {
        for (int o = tid; o < nrun * DIG; o += TC_THREADS) ((uint2 *)xd)[o] = make_uint2(0, 0);
        for (int gi = tid; gi < ngp; gi += TC_THREADS)
            P.xsum[(int64_t)tok * ngp + gi] = P.xe[(int64_t)tok * ngp + gi] = 0.0f;
        if (tid == 0) P.inv_sigma[tok] = 1.0f;
        return;
    }
    const float *x = P.x + (int64_t)tok * P.cols;
    const int nk = (nrun + TC_THREADS - 1) / TC_THREADS;
    const float inv = tc_prep_inv_rms(P, x, red);
    const int gr = P.group / 8; /* runs per group: 4, 8, 16 adjacent lanes */
    for (int k = 0; k < nk; k++) {
        const int o = tid + k * TC_THREADS;
        float v[8], m = 0.0f, s = 0.0f;
        int X[8];
        tc_prep_run(P, x, o, inv, v);
#pragma unroll
        for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(v[j]));
        for (int sh = 1; sh < gr; sh <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, sh));
        float e = 0.0f, ie = 0.0f; /* x = e X; X = rint(x ie) */
        if (m > 0.0f && m <= 3.4e38f) {
            if (DIG == 3) { /* a power of two: m < 2^ex, |X| <= 2^22 */
                int ex = ((__float_as_int(m) >> 23) & 0xff) - 126 - 22;
                ex = ex < -126 ? -126 : ex > 126 ? 126 : ex;
                e = __int_as_float((127 + ex) << 23);
                ie = __int_as_float((127 - ex) << 23);
            } else {
                e = m / 127.0f;
                ie = 127.0f / m;
            }
        }
        /* the group sums are of x as the digits carry it (e X): the bias term then multiplies the
         * same x as the codes' term, so fast mode's rounding of x meets W = scale q + bias whole
         * (centred) rather than the codes q alone */
#pragma unroll
        for (int j = 0; j < 8; j++) {
            X[j] = (int)rintf(v[j] * ie);
            if (DIG == 1) X[j] = X[j] > 127 ? 127 : X[j] < -127 ? -127 : X[j];
            s += (float)X[j] * e;
        }
        for (int sh = 1; sh < gr; sh <<= 1) s += __shfl_xor_sync(0xffffffffu, s, sh);
        if (o < nrun) {
            uint32_t pl[DIG][2] = {};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int r = X[j];
                const int slot = tc_i8_slot<PERM>(j);
#pragma unroll
                for (int p = 0; p < DIG; p++) { /* balanced base-256 digits, low first */
                    const int d = p + 1 < DIG ? ((r & 0xff) ^ 0x80) - 0x80 : r;
                    pl[p][slot >> 2] |= (uint32_t)(d & 0xff) << (8 * (slot & 3));
                    r = (r - d) >> 8;
                }
            }
            int8_t *dst = xd + ((int64_t)(o / 8) * DIG) * 64 + (o % 8) * 8;
#pragma unroll
            for (int p = 0; p < DIG; p++) *(uint2 *)(dst + p * 64) = make_uint2(pl[p][0], pl[p][1]);
            if (lane % gr == 0) {
                P.xe[(int64_t)tok * ngp + o / gr] = e;
                P.xsum[(int64_t)tok * ngp + o / gr] = s;
            }
        }
    }
    if (tid == 0) P.inv_sigma[tok] = 1.0f;
}
