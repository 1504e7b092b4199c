/* cuda_graph_check.h — the decode-step graph check shared by the CUDA parity tests: a model's
 * decode steps replayed from recorded CUDA graphs give the same bits as the same steps launched
 * op by op, and most steps are replays. */
#ifndef KILN_TEST_CUDA_GRAPH_CHECK_H
#define KILN_TEST_CUDA_GRAPH_CHECK_H

/* Two sequences of the model in `dir` (one alone, then both as a batch of two) decode 300 steps
 * with graphs + PDL off and on: the logits must be the same bits at every step (a kernel reading
 * before its PDL wait would show up as a difference), and all but 20 steps must have been
 * replays. The lengths cross the attention buckets (128, 256, ...) and the cache's growth from 256
 * rows. Only in CUDA builds. */
void cuda_graph_replay_check(const char *label, const char *dir);

#endif
