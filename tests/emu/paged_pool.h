/* paged_pool.h — a paged KV block pool built on the host as kv_paged.cu lays it out on the device,
 * for the emulators of kernels that read it (paged_attention_emulate.cc, fa_emulate.cc): blocks of
 * block_tokens tokens, K records [block_tokens][n_kv_heads] then V records at v_offset, each
 * record encoded by the CPU codec (kv_codec_encode), block ids shuffled through per-sequence
 * tables of a multi-layer stride, sequence 1's first block shared with sequence 0, blocks wholly
 * before a sliding window's reach set to -1. Keeps every record decoded (kv_codec_decode, back in
 * the original basis when the codec rotates) for the references. Include after kv_codec_shim.h. */
#ifndef KILN_TESTS_EMU_PAGED_POOL_H
#define KILN_TESTS_EMU_PAGED_POOL_H

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

extern "C" {
#include "kv/hadamard.h"
#include "kv/kv_codec.h"
}

/* A codec by name: f32 f16 bf16, q8 q4 (affine), t4 t3 (Lloyd-Max); an 'r' rotates the rows. */
static inline kv_codec emu_codec(const char *name, int group) {
    kv_codec c;
    memset(&c, 0, sizeof c);
    c.group = group;
    c.rotate = strchr(name, 'r') != nullptr;
    if (!strcmp(name, "f32")) c.kind = KV_CODEC_F32;
    if (!strcmp(name, "f16")) c.kind = KV_CODEC_F16;
    if (!strcmp(name, "bf16")) c.kind = KV_CODEC_BF16;
    if (name[0] == 'q') c.kind = KV_CODEC_AFFINE, c.bits = name[1] - '0';
    if (name[0] == 't') {
        c.kind = KV_CODEC_LLOYD, c.bits = name[1] - '0';
        kiln_lloyd_max_gaussian(c.bits, &c.lm);
    }
    return c;
}

/* kv_paged.cu's codec_params: the device codec of c for rows of dim elements. */
static inline kcu_codec emu_device_codec(const kv_codec &c, int dim) {
    kcu_codec o;
    memset(&o, 0, sizeof o);
    o.kind = c.kind, o.bits = c.bits, o.group = c.group, o.rotate = c.rotate;
    o.rec = (int)kv_codec_row_bytes(&c, dim);
    if (c.kind == KV_CODEC_LLOYD)
        for (int i = 0; i < (1 << c.bits); i++) {
            o.centroid[i] = c.lm.centroid[i];
            if (i + 1 < (1 << c.bits)) o.boundary[i] = c.lm.boundary[i];
        }
    return o;
}

struct emu_paged_pool {
    kcu_paged_layer L;
    int stride = 3, layer = 1; /* table_stride (layers) and the layer under test */
    std::vector<uint8_t> data;
    std::vector<std::vector<int32_t>> tables; /* per sequence */
    std::vector<float> Kref, Vref;            /* decoded rows [block][slot][kv head][dim] */

    /* keys[s]: positions sequence s holds (its cached length plus its new tokens); first[s]: its
     * first query's position (for the window); rnd: values in [-1, 1) */
    template <typename R>
    void build(const char *kname, const char *vname, int group, int n_kv, int hd, int vhd, int bt,
               int window, const std::vector<int> &keys, const std::vector<int> &first, R rnd) {
        const kv_codec ck = emu_codec(kname, group), cv = emu_codec(vname, group);
        memset(&L, 0, sizeof L);
        L.k = emu_device_codec(ck, hd), L.v = emu_device_codec(cv, vhd);
        L.block_tokens = bt, L.table_stride = stride, L.layer = layer;
        L.n_kv_heads = n_kv, L.head_dim = hd, L.v_head_dim = vhd, L.window = window;
        L.v_offset = ((int64_t)bt * n_kv * L.k.rec + 15) / 16 * 16;
        L.block_bytes = (L.v_offset + (int64_t)bt * n_kv * L.v.rec + 15) / 16 * 16;
        const int n_seq = (int)keys.size();
        tables.assign((size_t)n_seq, {});
        int n_blocks = 0;
        for (int s = 0; s < n_seq; s++) {
            const int nb = (keys[s] + bt - 1) / bt;
            tables[s].assign((size_t)std::max(nb, 1) * stride, -7); /* other layers: unused */
            for (int b = 0; b < nb; b++)
                tables[s][(size_t)b * stride + layer] = (s == 1 && b == 0) ? -2 : n_blocks++;
        }
        std::vector<int32_t> perm((size_t)n_blocks);
        std::iota(perm.begin(), perm.end(), 0);
        for (int i = n_blocks - 1; i > 0; i--) {
            int j = (int)((rnd() + 1.0f) * 0.5f * (float)(i + 1));
            std::swap(perm[(size_t)i], perm[(size_t)std::min(j, i)]);
        }
        for (int s = 0; s < n_seq; s++)
            for (size_t b = 0; b * stride < tables[s].size(); b++) {
                int32_t &id = tables[s][b * stride + layer];
                if (id == -2)
                    id = tables[0][layer]; /* the shared first block (already permuted) */
                else if (id >= 0)
                    id = perm[(size_t)id];
            }
        data.assign((size_t)std::max(n_blocks, 1) * L.block_bytes, 0xa5);
        L.data = data.data();
        Kref.assign((size_t)n_blocks * bt * n_kv * hd, 0.0f);
        Vref.assign((size_t)n_blocks * bt * n_kv * vhd, 0.0f);
        std::vector<float> row((size_t)std::max(hd, vhd)), tmp(row.size());
        for (int b = 0; b < n_blocks; b++)
            for (int slot = 0; slot < bt; slot++)
                for (int h = 0; h < n_kv; h++)
                    for (int which = 0; which < 2; which++) {
                        const int dim = which ? vhd : hd;
                        const kv_codec &c = which ? cv : ck;
                        for (int d = 0; d < dim; d++) row[d] = rnd() * (which ? 1.0f : 1.5f);
                        const size_t slot_h = (size_t)slot * n_kv + h;
                        uint8_t *rec = data.data() + (size_t)b * L.block_bytes +
                                       (which ? L.v_offset + slot_h * L.v.rec : slot_h * L.k.rec);
                        kv_codec_encode(&c, row.data(), dim, rec, tmp.data());
                        float *dst = (which ? Vref.data() : Kref.data()) +
                                     ((size_t)b * bt * n_kv + slot_h) * dim;
                        kv_codec_decode(&c, rec, dim, dst);
                        if (c.rotate) kiln_hadamard_unrotate(dst, dim);
                    }
        if (window > 0) /* blocks wholly before the first query's window: dropped */
            for (int s = 0; s < n_seq; s++)
                for (size_t b = 0; b * stride < tables[s].size(); b++)
                    if ((int)((b + 1) * bt) <= first[s] - window + 1)
                        tables[s][b * stride + layer] = -1;
    }
    /* the decoded key / value row of sequence s at position j, kv head h */
    const float *key(int s, int j, int h) const {
        const int id = tables[s][(size_t)(j / L.block_tokens) * stride + layer];
        return Kref.data() +
               (((size_t)id * L.block_tokens + j % L.block_tokens) * L.n_kv_heads + h) * L.head_dim;
    }
    const float *value(int s, int j, int h) const {
        const int id = tables[s][(size_t)(j / L.block_tokens) * stride + layer];
        return Vref.data() +
               (((size_t)id * L.block_tokens + j % L.block_tokens) * L.n_kv_heads + h) *
                   L.v_head_dim;
    }
};

#endif
