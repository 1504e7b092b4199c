/* cuda_link_check.h — the qg_link check shared by the CUDA parity tests: a quantized model's
 * decode with x's digits handed from op to op (KILN_CUDA_QGEMV_LINK) gives the same bits as
 * without, and the hand-offs happen. */
#ifndef KILN_TEST_CUDA_LINK_CHECK_H
#define KILN_TEST_CUDA_LINK_CHECK_H

/* Two copies of the quantized model in `dir`, decoding the same steps (a sequence alone, then
 * two as one batch) with the link off and in `mode` (1: the blocks of a group meet through
 * global atomics, 2: as a cluster), and the digits never made inside the GEMV's blocks (so that
 * tiny fixtures take the two-pass GEMV the link applies to): the logits must be the same bits at
 * every step, and at least min_links GEMVs must have taken handed-on digits (mode 2: and as
 * many launches have run in clusters). Only in CUDA builds. */
void cuda_link_check(const char *label, const char *dir, int mode, long long min_links);

#endif
