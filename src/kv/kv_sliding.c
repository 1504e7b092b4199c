/* kv_sliding.c — the window policy of sliding-window layers in paged caches: which leading
 * blocks are dead (freed as the window moves) and which positions a rollback would need. */
#include "kv/kv_sliding.h"

int kv_sliding_first_needed(int len, int window) {
    if (window <= 0) return 0;
    int first = len - window + 1;
    return first > 0 ? first : 0;
}

int kv_sliding_dead_blocks(int len, int window, int block_tokens) {
    return kv_sliding_first_needed(len, window) / block_tokens;
}
