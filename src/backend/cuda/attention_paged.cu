/* attention_paged.cu — attention of new queries against a paged device KV cache (kv_paged.cu):
 * keys and values are read through each sequence's device block table and decoded in the kernel
 * from their codec (f32 / f16 / bf16, affine q8 / q4, TurboQuant), never gathered into a copy.
 *
 * The kernel is attention.cu's flash-style kernel with a different tile loader: a block owns one
 * KV head and a tile of rows (query token x query head of the GQA group); every 32-key tile of
 * K and V is decoded once into shared memory (f32) and used by all its rows, each warp decoding
 * whole records (a key's block-table lookup once, its lanes along the row, a group's scale once);
 * each warp keeps an online softmax for its rows. Long key ranges with few blocks (decode) are
 * split over gridDim.z and merged by log-sum-exp. Keys rotated by the Hadamard transform (turbo
 * ...:rotk) are scored against the rotated query (q.k is invariant under the orthonormal rotation);
 * TurboQuant values are accumulated in the rotated basis and each output row is unrotated once at
 * the end, as kv_paged.c does on the CPU. tests/emu/paged_attention_emulate.cc compiles the kernels
 * and the launch plan on the CPU (PATT_HOST_EMU) with emulated warps. */
#include "backend/cuda/attention_paged.cuh"
#include "backend/cuda/attention_paged_decode.cuh"
#include "backend/cuda/attention_tile.cuh"
#ifndef PATT_HOST_EMU
#define PATT_SMEM(name) extern __shared__ float name[]
#endif

#define PATT_WARPS 4
#define PATT_KT    32

struct patt_seq {
    const int32_t *table;
    int pos0, n, t0; /* first position, tokens, first row of q / out */
    int kbeg;        /* first key any of its queries sees (window) */
};

/* Kernel parameters: the layer, the shared geometry and up to KCU_ATT_MAX_SEQ sequences.
 * blockIdx.z = seq * splits + split. */
struct patt_launch {
    kcu_paged_layer L;
    const float *q;           /* [T, n_heads*head_dim] stacked rows of all sequences */
    float *out;               /* [T, n_heads*v_head_dim] */
    const int32_t *positions; /* device positions of the stacked rows, or NULL */
    int n_heads;
    float scale, softcap;
    int group;
    int kps, splits; /* split z covers keys [kbeg + z*kps, kbeg + (z+1)*kps) */
    int rows_max;    /* max n * group over the sequences: the partials' row stride */
    float *part_o;   /* [seqs, splits, n_kv_heads, rows_max, v_head_dim] (splits > 1) */
    float *part_ml;  /* [seqs, splits, n_kv_heads, rows_max, 2] */
    int n_seq;
    patt_seq s[KCU_ATT_MAX_SEQ];
};

/* (2 blocks a SM in the bounds: without it ptxas gives the 1-row variants 56-64 registers and
 * spills 4-40 bytes; with it 72-86 registers, no spills) */
template <int DPL, int RPW>
__global__ void __launch_bounds__(PATT_WARPS * 32, 2)
    k_paged_attn(const __grid_constant__ patt_launch P) {
    KCU_PDL_ENTER();
    const int si = blockIdx.z / P.splits, z = blockIdx.z - si * P.splits;
    const patt_seq &S = P.s[si];
    const kcu_paged_layer &L = P.L;
    const int ROWS = PATT_WARPS * RPW, row0 = blockIdx.x * ROWS, G = P.group;
    const int rows_total = S.n * G;
    if (row0 >= rows_total) return; /* a shorter sequence of the batch: whole block idle */
    const int hd = L.head_dim, vhd = L.v_head_dim, n_heads = P.n_heads;
    const float *q = P.q + (int64_t)S.t0 * n_heads * hd;
    float *out = P.out + (int64_t)S.t0 * n_heads * vhd;
    /* positions in device memory (a recorded decode step): this step's, not the recording's */
    const int pos0 = P.positions ? P.positions[S.t0] : S.pos0;
    const int kbeg = P.positions ? (L.window > 0 ? max(0, pos0 - L.window + 1) : 0) : S.kbeg;
    PATT_SMEM(sm);
    float *Qs = sm;                      /* [ROWS][hd] */
    float *Ks = Qs + ROWS * hd;          /* [KT][hd+1] (padded: lanes read different banks) */
    float *Vs = Ks + PATT_KT * (hd + 1); /* [KT][vhd] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kvh = blockIdx.y;
    const bool rotk = L.k.rotate != 0;

    for (int i = threadIdx.x; i < ROWS * hd; i += blockDim.x) {
        int r = row0 + i / hd, d = i % hd;
        float v = 0.0f;
        if (r < rows_total) {
            int t = r / G, h = kvh * G + r % G;
            v = q[((int64_t)t * n_heads + h) * hd + d];
            v = rotk ? v * kcu_hadamard_sign(d) : v * P.scale;
        }
        Qs[i] = v;
    }
    if (rotk) { /* q -> H.D.q / sqrt(hd) (kiln_hadamard_rotate), then the scale */
        kcu_fwht_rows(Qs, ROWS, hd);
        const float s = kcu_inv_sqrt_rn(hd);
        for (int i = threadIdx.x; i < ROWS * hd; i += blockDim.x)
            Qs[i] = __fmul_rn(Qs[i], s) * P.scale;
    }

    /* rows of this warp: their token, and visible keys [lo, hi); the block's keys */
    int lo[RPW], hi[RPW];
    bool live[RPW];
    att_warp_rows<RPW>(row0, warp, rows_total, pos0, G, L.window, lo, hi, live);
    int k0, k1;
    att_block_keys(row0, ROWS, rows_total, pos0, G, L.window, kbeg + z * P.kps,
                   kbeg + (z + 1) * P.kps, &k0, &k1);
    float m[RPW], l[RPW], acc[RPW][DPL];
    att_state_init<DPL, RPW>(m, l, acc);

    for (int ks = k0; ks < k1; ks += PATT_KT) {
        __syncthreads(); /* Q staged / previous tile consumed */
        /* key rows by warp (warp-uniform record pointers), elements by lane; zeros past k1 and
         * for blocks a window dropped */
        for (int j = warp; j < PATT_KT; j += PATT_WARPS) {
            const int key = ks + j;
            const uint8_t *kr = key < k1 ? kcu_paged_rec(L, S.table, key, kvh, false) : NULL;
            const uint8_t *vr = key < k1 ? kcu_paged_rec(L, S.table, key, kvh, true) : NULL;
            kcu_codec_row_lane(L.k, kr, hd, lane, Ks + j * (hd + 1));
            kcu_codec_row_lane(L.v, vr, vhd, lane, Vs + j * vhd);
        }
        __syncthreads();
        if (!live[0]) continue; /* a warp past the block's last row only loads (warp-uniform) */
        att_tile_update<DPL, RPW, PATT_KT>(Qs + warp * RPW * hd, Ks, Vs, hd, vhd, lane, ks, k1, lo,
                                           hi, live, P.softcap, m, l, acc);
    }
    att_store_rows<DPL, RPW>(
        row0, warp, lane, G, kvh, n_heads, vhd, P.splits, out, P.part_o, P.part_ml,
        (((int64_t)si * P.splits + z) * L.n_kv_heads + kvh) * P.rows_max, live, m, l, acc);
}

/* One block per (row, kv head, seq): out = sum_z acc_z e^(m_z - M) / sum_z l_z e^(m_z - M). */
__global__ void k_paged_attn_merge(const __grid_constant__ patt_launch P) {
    KCU_PDL_ENTER();
    const kcu_paged_layer &L = P.L;
    const patt_seq &S = P.s[blockIdx.z];
    const int row = blockIdx.x, kvh = blockIdx.y, vhd = L.v_head_dim, G = P.group;
    const int splits = P.splits;
    if (row >= S.n * G) return;
    const int64_t per_split = (int64_t)L.n_kv_heads * P.rows_max;
    const int64_t base = (int64_t)blockIdx.z * splits * per_split + (int64_t)kvh * P.rows_max + row;
    const int t = row / G, h = kvh * G + row % G;
    att_merge_row(P.part_o, P.part_ml, per_split, base, splits, vhd,
                  P.out + ((int64_t)(S.t0 + t) * P.n_heads + h) * vhd);
}

/* TurboQuant values: each output row (token t of seq blockIdx.z, head blockIdx.y) back from the
 * rotated basis, x <- D.H.x / sqrt(vhd) (kiln_hadamard_unrotate). */
__global__ void k_paged_unrotate(const __grid_constant__ patt_launch P) {
    KCU_PDL_ENTER();
    const patt_seq &S = P.s[blockIdx.z];
    const int t = blockIdx.x, h = blockIdx.y, vhd = P.L.v_head_dim;
    if (t >= S.n) return;
    PATT_SMEM(xs);
    float *o = P.out + ((int64_t)(S.t0 + t) * P.n_heads + h) * vhd;
    for (int d = threadIdx.x; d < vhd; d += blockDim.x) xs[d] = o[d];
    kcu_fwht_rows(xs, 1, vhd);
    const float s = kcu_inv_sqrt_rn(vhd);
    for (int d = threadIdx.x; d < vhd; d += blockDim.x) o[d] = xs[d] * (s * kcu_hadamard_sign(d));
}

/* The launch plan of one chunk of at most KCU_ATT_MAX_SEQ sequences (no device calls; the
 * emulator runs it too): P's sequences and split geometry (attention.cu's), the grid's row tiles
 * and rows per warp. False: no tokens. */
static bool patt_plan(patt_launch *P, const kcu_paged_layer *L, const float *q, float *out,
                      const kiln_attn_params *p, const kcu_paged_seq *seqs, int n_seq, int n_sms,
                      int *tiles_out, int *rpw_out) {
    memset(P, 0, sizeof *P);
    P->L = *L;
    P->q = q;
    P->out = out;
    P->positions = p->positions;
    P->n_heads = p->n_heads;
    P->scale = p->scale;
    P->softcap = p->softcap;
    P->group = p->n_heads / L->n_kv_heads;
    P->n_seq = n_seq;
    int max_n = 0, keys = 0;
    for (int i = 0; i < n_seq; i++) {
        patt_seq *d = &P->s[i];
        d->table = seqs[i].table;
        d->pos0 = seqs[i].pos0;
        d->n = seqs[i].n > 0 ? seqs[i].n : 0;
        d->t0 = seqs[i].t0;
        d->kbeg = L->window > 0 ? (d->pos0 - L->window + 1 > 0 ? d->pos0 - L->window + 1 : 0) : 0;
        int kend = d->pos0 + d->n;
        if (kend - d->kbeg > keys) keys = kend - d->kbeg;
        if (d->n > max_n) max_n = d->n;
    }
    if (max_n <= 0) return false;
    if (p->positions && max_n == 1) keys = kcu_attn_keys_bucket(keys);
    P->rows_max = max_n * P->group;
    const int rpw = P->rows_max <= 2 * PATT_WARPS ? 1 : 4;
    const int rows_per_block = PATT_WARPS * rpw;
    const int tiles = (P->rows_max + rows_per_block - 1) / rows_per_block;
    const int blocks = tiles * L->n_kv_heads * n_seq;
    int splits = 1;
    if (blocks < 2 * n_sms && keys > PATT_KT) {
        splits = (4 * n_sms + blocks - 1) / blocks;
        int max_splits = keys > 1024 ? (keys + 127) / 128 : (keys + PATT_KT - 1) / PATT_KT;
        if (splits > max_splits) splits = max_splits;
    }
    P->kps = (keys + splits - 1) / splits;
    P->kps = (P->kps + PATT_KT - 1) / PATT_KT * PATT_KT;
    splits = (keys + P->kps - 1) / P->kps;
    if (splits < 1) splits = 1;
    P->splits = splits;
    *tiles_out = tiles;
    *rpw_out = rpw;
    return true;
}

/* Shared memory of k_paged_attn<DPL, RPW>: Q rows, the K tile (padded rows), the V tile. */
static size_t patt_smem_bytes(int rpw, int hd, int vhd) {
    return sizeof(float) *
           ((size_t)PATT_WARPS * rpw * hd + (size_t)PATT_KT * (hd + 1) + (size_t)PATT_KT * vhd);
}

/* The one-launch decode kernel (attention_paged_decode.cuh) for P's chunk, when it takes it:
 * every sequence one token, records of a load class (pdec_class), the group's shared memory in
 * bounds; max_splits > 0 caps its key splits. Fills A (not its partials / counters); returns
 * the load class, or -1: k_paged_attn. (No device calls; the emulator runs it too.) */
static int pdec_plan(pdec_args *A, const patt_launch &P, int n_sms, int max_splits, int min_keys) {
    const kcu_paged_layer &L = P.L;
    if (P.rows_max != P.group || P.n_seq > ATTS_MAX_SEQ) return -1; /* not one token each */
    const int cls = pdec_class(L);
    if (cls < 0 || !atts_applies(P.group, L.head_dim, L.v_head_dim)) return -1;
    memset(A, 0, sizeof *A);
    A->L = L;
    A->q = P.q, A->out = P.out, A->positions = P.positions;
    A->n_heads = P.n_heads, A->group = P.group;
    A->nsub = (P.group + atts_heads_per_block(P.group, L.head_dim, L.v_head_dim) - 1) /
              atts_heads_per_block(P.group, L.head_dim, L.v_head_dim);
    A->scale = P.scale, A->softcap = P.softcap;
    int keys = 0;
    for (int i = 0; i < P.n_seq; i++) {
        A->s[i].table = P.s[i].table, A->s[i].pos0 = P.s[i].pos0, A->s[i].t0 = P.s[i].t0;
        const int k = P.s[i].pos0 + 1 - P.s[i].kbeg;
        if (k > keys) keys = k;
    }
    if (P.positions) keys = kcu_attn_keys_bucket(keys); /* a recorded step: its bucket */
    atts_split_plan(L.n_kv_heads * A->nsub * P.n_seq, keys, n_sms, max_splits, min_keys, &A->splits,
                    &A->kps);
    return cls;
}

#ifndef PATT_HOST_EMU
template <int DPL, int RPW> static void launch(kcu_state *st, const patt_launch &P, dim3 grid) {
    const size_t smem = patt_smem_bytes(RPW, P.L.head_dim, P.L.v_head_dim);
    static size_t raised = 48 * 1024;
    if (smem > raised) {
        if (!KCU_CHECK(st, cudaFuncSetAttribute(k_paged_attn<DPL, RPW>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)smem)))
            return;
        raised = smem;
    }
    KCU_LAUNCH(st, (k_paged_attn<DPL, RPW>), grid, PATT_WARPS * 32, smem, P);
    KCU_LAUNCHED(st);
}

template <int RPW> static void launch_dpl(kcu_state *st, const patt_launch &P, dim3 grid) {
    const int vhd = P.L.v_head_dim;
    if (vhd <= 64)
        launch<2, RPW>(st, P, grid);
    else if (vhd <= 128)
        launch<4, RPW>(st, P, grid);
    else if (vhd <= 256)
        launch<8, RPW>(st, P, grid);
    else
        launch<16, RPW>(st, P, grid);
}

/* KILN_CUDA_PAGED_DECODE: 0 keeps decode steps on k_paged_attn (A/B runs); N > 1 caps the
 * one-launch kernel's splits at N. Default 1: the one-launch kernel wherever it applies. */
static int g_pdec = -1;
static int pdec_mode(void) {
    if (g_pdec < 0) {
        const char *e = getenv("KILN_CUDA_PAGED_DECODE");
        g_pdec = e && *e ? atoi(e) : 1;
        if (g_pdec < 0) g_pdec = 0;
    }
    return g_pdec;
}

template <int CLS> struct pdec_launcher {
    kcu_state *st;
    const pdec_args &A;
    dim3 grid;
    template <int GM, int CH, int KB> void run() {
        const size_t smem = pdec_smem_bytes(A);
        static size_t raised = 48 * 1024; /* per instance */
        if (smem > raised) {
            if (!KCU_CHECK(st, cudaFuncSetAttribute(k_paged_decode<GM, CH, KB, CLS>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    (int)smem)))
                return;
            raised = smem;
        }
        KCU_LAUNCH(st, (k_paged_decode<GM, CH, KB, CLS>), grid, ATTS_WARPS * 32, smem, A);
        KCU_LAUNCHED(st);
    }
};

/* The one-launch decode kernel for P's chunk: true when launched (or its scratch failed and the
 * error is set). */
static bool paged_decode(kcu_state *st, const patt_launch &P) {
    const int mode = pdec_mode();
    pdec_args A;
    const int cls =
        mode == 0 ? -1 : pdec_plan(&A, P, st->n_sms, mode > 1 ? mode : 0, kcu_att_split_min_keys());
    if (cls < 0) return false;
    if ((int64_t)P.n_seq * P.L.n_kv_heads * A.nsub > KCU_ATT_COUNTERS) return false;
    if (A.splits > 1) {
        const size_t n_part = (size_t)P.n_seq * P.n_heads * A.splits;
        float *scr = (float *)kcu_scratch(st, n_part * (size_t)(P.L.v_head_dim + 2) * 4);
        if (!scr) return true; /* reported */
        A.part_o = scr;
        A.part_ml = scr + n_part * P.L.v_head_dim;
        A.counters = st->attn_counters;
    }
    const dim3 grid((unsigned)(P.L.n_kv_heads * A.nsub), (unsigned)P.n_seq, (unsigned)A.splits);
    if (cls == PDEC_F32) {
        pdec_launcher<PDEC_F32> f = {st, A, grid};
        atts_dispatch_geometry(A.group, P.L.head_dim, P.L.v_head_dim, f);
    } else if (cls == PDEC_F16) {
        pdec_launcher<PDEC_F16> f = {st, A, grid};
        atts_dispatch_geometry(A.group, P.L.head_dim, P.L.v_head_dim, f);
    } else {
        pdec_launcher<PDEC_QUANT> f = {st, A, grid};
        atts_dispatch_geometry(A.group, P.L.head_dim, P.L.v_head_dim, f);
    }
    return true;
}

/* One chunk of at most KCU_ATT_MAX_SEQ sequences. */
static void paged_chunk(kcu_state *st, const kcu_paged_layer *L, const float *q, float *out,
                        const kiln_attn_params *p, const kcu_paged_seq *seqs, int n_seq) {
    patt_launch P;
    int tiles = 0, rpw = 1;
    if (!patt_plan(&P, L, q, out, p, seqs, n_seq, st->n_sms, &tiles, &rpw)) return;
    const int splits = P.splits, max_n = P.rows_max / P.group;
    if (paged_decode(st, P)) {
        if (L->v.rotate) {
            KCU_LAUNCH(st, k_paged_unrotate, dim3(1, p->n_heads, n_seq), 128,
                       (size_t)L->v_head_dim * sizeof(float), P);
            KCU_LAUNCHED(st);
        }
        return;
    }
    if (splits > 1) {
        size_t n_part = (size_t)n_seq * splits * L->n_kv_heads * P.rows_max;
        float *scr = (float *)kcu_scratch(st, n_part * (L->v_head_dim + 2) * sizeof(float));
        if (!scr) return;
        P.part_o = scr;
        P.part_ml = scr + n_part * L->v_head_dim;
    }
    dim3 grid(tiles, L->n_kv_heads, n_seq * splits);
    if (rpw == 1)
        launch_dpl<1>(st, P, grid);
    else
        launch_dpl<4>(st, P, grid);
    if (splits > 1) {
        KCU_LAUNCH(st, k_paged_attn_merge, dim3(P.rows_max, L->n_kv_heads, n_seq), 128, 0, P);
        KCU_LAUNCHED(st);
    }
    if (L->v.rotate) {
        KCU_LAUNCH(st, k_paged_unrotate, dim3(max_n, p->n_heads, n_seq), 128,
                   (size_t)L->v_head_dim * sizeof(float), P);
        KCU_LAUNCHED(st);
    }
}

void kcu_paged_unrotate_rows(kcu_state *st, const kcu_paged_layer *L, float *out,
                             const kiln_attn_params *p, const kcu_paged_seq *seqs, int n_seq) {
    patt_launch P;
    int tiles = 0, rpw = 1;
    if (n_seq <= 0 || n_seq > KCU_ATT_MAX_SEQ ||
        !patt_plan(&P, L, NULL, out, p, seqs, n_seq, st->n_sms, &tiles, &rpw))
        return;
    KCU_LAUNCH(st, k_paged_unrotate, dim3(P.rows_max / P.group, p->n_heads, n_seq), 128,
               (size_t)L->v_head_dim * sizeof(float), P);
    KCU_LAUNCHED(st);
}

void kcu_paged_attention(kcu_state *st, const kcu_paged_layer *L, const float *q, float *out,
                         const kiln_attn_params *p, const kcu_paged_seq *seqs, int n_seq) {
    if (n_seq <= 0) return;
    if (L->v_head_dim > 512 || L->n_kv_heads <= 0 || p->n_heads % L->n_kv_heads) {
        kcu_report(st, "kcu_paged_attention", "unsupported head geometry", __FILE__, __LINE__);
        return;
    }
    /* long prefill chunks to the tensor-core kernel, the rest (decode, short chunks, rotated
     * records) here */
    kcu_paged_seq rest[KCU_ATT_MAX_SEQ];
    for (int i = 0; i < n_seq; i += KCU_ATT_MAX_SEQ) {
        const int count = n_seq - i < KCU_ATT_MAX_SEQ ? n_seq - i : KCU_ATT_MAX_SEQ;
        const int n_rest = kcu_attention_prefill_tc_paged(st, L, q, out, p, seqs + i, count, rest);
        if (n_rest > 0) paged_chunk(st, L, q, out, p, rest, n_rest);
    }
}
#endif
