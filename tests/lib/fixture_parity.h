/* fixture_parity.h — the check every model family and backend must pass against a fixture in
 * ../shared/fixtures: logits of one full forward and of token-by-token decoding match
 * transformers' float32 logits (relative L2 <= tol), the 24-token greedy continuation is identical
 * (through the cache, and by full forwards without reuse), and a batch of three sequences at
 * different offsets gives each the logits it gets alone. */
#ifndef KILN_TEST_FIXTURE_PARITY_H
#define KILN_TEST_FIXTURE_PARITY_H

#include "kiln.h"

#include <cjson/cJSON.h>

#include <stdbool.h>

typedef struct fixture_parity_opts {
    kiln_device device;
    double tol;          /* relative L2 bound on logits */
    bool allow_near_tie; /* greedy flips at a near-tie are reported, not failed */
    double near_tie;     /* with allow_near_tie: the logit gap (of max |logit|) that is one;
                          * 0: 2e-3 */
} fixture_parity_opts;

/* name: folder under fixtures/, e.g. "qwen3-mlx-q4g32". Records CHECK results. */
void fixture_parity_check(const char *name, const fixture_parity_opts *o);

/* kiln_forward_sample picks the token kiln_sampler_sample picks from kiln_forward's logits: two
 * copies of a decode (greedy, plain T=1 draws, and top-k/top-p/min-p with penalties), one sampled
 * by the caller, one inside the forward (on the GPU for cuda), with samplers of the same seed,
 * alone and (from step 12) second in a batch of two; the ids must agree at every step. */
void fixture_sampling_check(const char *name, kiln_device device);

/* Gemma 4 with the MoE block: no shared fixture has one, so tests/gemma4_moe_ref.py builds a tiny
 * random model and its float64 numpy logits from a reading of transformers' modeling_gemma4.py
 * (not transformers output). Full forward and token-by-token decoding on `device` must match it
 * within relative L2 tol. python_optional: a machine whose python3 cannot run the script (no
 * numpy) leaves the check out with a line saying so, instead of failing. */
void fixture_gemma4_moe_check(kiln_device device, double tol, bool python_optional);

/* A JSON array of numbers as malloc'd int32 ids (n set to its length). */
int32_t *fixture_json_ids(const cJSON *arr, int *n);

#endif
