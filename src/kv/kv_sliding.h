/* kv_sliding.h — which blocks a sliding-window layer still needs. A query at position pos sees
 * keys pos-window+1..pos, so once the sequence holds len tokens every later query needs only
 * positions >= len-window+1; older blocks are returned to the pool. */
#ifndef KILN_KV_SLIDING_H
#define KILN_KV_SLIDING_H

#include <stdbool.h>

/* First position any query at position >= len can see in a window-token layer (0 = all). */
int kv_sliding_first_needed(int len, int window);
/* Number of leading blocks (of block_tokens) that no query at position >= len can see. */
int kv_sliding_dead_blocks(int len, int window, int block_tokens);

#endif
