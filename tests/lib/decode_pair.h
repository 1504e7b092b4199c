/* decode_pair.h — two copies of one model decoding the same steps, their logits compared bit
 * for bit: the driver of the checks that a setting (CUDA graphs, qg_link) changes no result. */
#ifndef KILN_TEST_DECODE_PAIR_H
#define KILN_TEST_DECODE_PAIR_H

#include "kiln.h"

/* m[0] and m[1] (the same model) each prefill two sequences (7 and 3 prompt tokens), then decode
 * `steps` steps of pseudo-random tokens: the first `alone` with sequence 0 alone, the rest with
 * both as one batch of two. before(copy, ctx), when set, runs before each forward of copy 0 or
 * 1. Returns the number of (step, sequence) logit rows that differ; *first_bad: the first such
 * step, or -1. Failed calls are CHECK failures. */
int decode_pair_mismatches(kiln_model *const m[2], int steps, int alone,
                           void (*before)(int copy, void *ctx), void *ctx, int *first_bad);

#endif
