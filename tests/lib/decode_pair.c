/* decode_pair.c — decode_pair_mismatches (decode_pair.h): the same decode on two copies of a
 * model, compared bit for bit. */
#include "decode_pair.h"

#include "test_util.h"

#include <stdlib.h>
#include <string.h>

int decode_pair_mismatches(kiln_model *const m[2], int steps, int alone,
                           void (*before)(int copy, void *ctx), void *ctx, int *first_bad) {
    const int V = kiln_model_get_info(m[0])->vocab_size;
    kiln_seq *s[2][2] = {{0}};
    float *row[2][2];
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < 2; i++) {
            CHECK_OK(kiln_seq_new(m[g], &s[g][i]));
            row[g][i] = malloc((size_t)V * sizeof(float));
        }
    const int32_t prompt[7] = {1, 5, 9, 2, 7, 3, 11};
    for (int g = 0; g < 2; g++) { /* seq 0: 7 prompt tokens, seq 1: 3 */
        if (before) before(g, ctx);
        kiln_batch_entry e = {s[g][0], prompt, 7, KILN_LOGITS_NONE, NULL};
        CHECK_OK(kiln_forward(m[g], &e, 1));
        e = (kiln_batch_entry){s[g][1], prompt, 3, KILN_LOGITS_NONE, NULL};
        CHECK_OK(kiln_forward(m[g], &e, 1));
    }
    int mismatches = 0;
    *first_bad = -1;
    for (int t = 0; t < steps; t++) {
        int32_t tok[2] = {(int32_t)((t * 7919 + 13) % V), (int32_t)((t * 104729 + 5) % V)};
        const int n = t < alone ? 1 : 2;
        for (int g = 0; g < 2; g++) {
            if (before) before(g, ctx);
            kiln_batch_entry e[2];
            for (int i = 0; i < n; i++)
                e[i] = (kiln_batch_entry){s[g][i], &tok[i], 1, KILN_LOGITS_LAST, row[g][i]};
            CHECK_OK(kiln_forward(m[g], e, n));
        }
        for (int i = 0; i < n; i++)
            if (memcmp(row[0][i], row[1][i], (size_t)V * sizeof(float)) != 0) {
                if (*first_bad < 0) *first_bad = t;
                mismatches++;
            }
    }
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < 2; i++) {
            kiln_seq_free(s[g][i]);
            free(row[g][i]);
        }
    return mismatches;
}
