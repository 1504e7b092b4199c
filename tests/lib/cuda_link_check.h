/* cuda_link_check.h — the qg_link check shared by the CUDA parity tests: a quantized model's
 * decode with x's digits handed from op to op (KILN_CUDA_QGEMV_LINK) gives the same bits as
 * without, and the hand-offs happen. */
#ifndef KILN_TEST_CUDA_LINK_CHECK_H
#define KILN_TEST_CUDA_LINK_CHECK_H

/* Two copies of the quantized model in `dir`, decoding the same steps (a sequence alone, then
 * two as one batch) with the link off and on, and the digits never made inside the GEMV's blocks
 * (so that tiny fixtures take the two-pass GEMV the link applies to): the logits must be the same
 * bits at every step, and at least min_links GEMVs must have taken handed-on digits. Only in
 * CUDA builds. */
void cuda_link_check(const char *label, const char *dir, long long min_links);

#endif
