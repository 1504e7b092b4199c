/* rope.c — rotary-embedding inverse frequencies for each scaling scheme transformers implements
 * (default, linear, llama3, proportional), computed in double and rounded to f32. */
#include "model/model.h"

#include "util/half.h"
#include "util/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

kiln_status kiln_rope_inv_freq(const kiln_rope_config *rope, int rot_dim, float *out) {
    if (rot_dim <= 0 || rot_dim % 2)
        return kiln_error(KILN_ERR_FORMAT, "rope: rotary dimension %d must be positive and even",
                          rot_dim);
    double theta = rope->theta > 0 ? rope->theta : 10000.0;
    const char *type = rope->type[0] ? rope->type : "default";
    int half = rot_dim / 2;
    for (int i = 0; i < half; i++) {
        /* transformers computes base ** (arange(0, dim, 2) / dim) in float32 */
        float expo = (float)(2 * i) / (float)rot_dim;
        out[i] = (float)(1.0 / pow(theta, (double)expo));
    }
    if (strcmp(type, "default") == 0 || strcmp(type, "proportional") == 0) return KILN_OK;
    if (strcmp(type, "linear") == 0) {
        double f = rope->factor > 0 ? rope->factor : 1.0;
        for (int i = 0; i < half; i++) out[i] = (float)(out[i] / f);
        return KILN_OK;
    }
    if (strcmp(type, "llama3") == 0) {
        double factor = rope->factor > 0 ? rope->factor : 8.0;
        double lo = rope->low_freq_factor > 0 ? rope->low_freq_factor : 1.0;
        double hi = rope->high_freq_factor > 0 ? rope->high_freq_factor : 4.0;
        double old_ctx = rope->original_max_position > 0 ? rope->original_max_position : 8192;
        double lo_wavelen = old_ctx / lo, hi_wavelen = old_ctx / hi;
        for (int i = 0; i < half; i++) {
            double f = out[i];
            double wavelen = 2.0 * M_PI / f;
            double scaled = wavelen > lo_wavelen ? f / factor : f;
            if (!(wavelen < hi_wavelen) && !(wavelen > lo_wavelen)) {
                double smooth = (old_ctx / wavelen - lo) / (hi - lo);
                scaled = (1.0 - smooth) * scaled / factor + smooth * scaled;
            }
            out[i] = (float)scaled;
        }
        return KILN_OK;
    }
    return kiln_error(KILN_ERR_UNSUPPORTED, "rope: scaling type '%s' is not supported", type);
}

void kiln_rope_round_to_dtype(float *inv_freq, int n, kiln_dtype dtype) {
    for (int i = 0; i < n; i++) {
        if (dtype == KILN_DT_BF16)
            inv_freq[i] = kiln_bf16_to_f32(kiln_f32_to_bf16(inv_freq[i]));
        else if (dtype == KILN_DT_F16)
            inv_freq[i] = kiln_f16_to_f32(kiln_f32_to_f16(inv_freq[i]));
    }
}

kiln_status kiln_rope_upload(kiln_model *m, int head_dim, kiln_dtype dtype, int *rot,
                             float **inv_freq) {
    const float prf =
        m->cfg.rope.partial_rotary_factor > 0 ? m->cfg.rope.partial_rotary_factor : 1.0f;
    int r = (int)(head_dim * prf);
    r -= r % 2;
    *rot = r;
    float *inv = malloc((size_t)(r > 0 ? r / 2 : 1) * sizeof *inv);
    if (!inv) return kiln_error(KILN_ERR_OOM, "out of memory");
    kiln_status st = kiln_rope_inv_freq(&m->cfg.rope, r, inv);
    /* transformers casts the rotary inv_freq buffer along with the model to its dtype, so a
     * checkpoint stored (and run) in bf16/f16 rotates with inv_freq rounded to that dtype. */
    if (st == KILN_OK) {
        kiln_rope_round_to_dtype(inv, r / 2, dtype);
        *inv_freq = m->be->alloc(m->be, (size_t)(r / 2) * sizeof(float));
        if (!*inv_freq)
            st = kiln_error(KILN_ERR_OOM, "out of memory");
        else
            m->be->upload(m->be, *inv_freq, inv, (size_t)(r / 2) * sizeof(float));
    }
    free(inv);
    return st;
}
