/* huge_alloc.h — large anonymous allocations backed by transparent huge pages where the kernel
 * allows them (madvise mode). Big arrays read with strides (the paged KV pool: a head's rows are
 * a few hundred bytes every few kilobytes) otherwise miss the TLB on almost every row, and a miss
 * costs a two-level page walk under a hypervisor. */
#ifndef KILN_UTIL_HUGE_ALLOC_H
#define KILN_UTIL_HUGE_ALLOC_H

#include <stddef.h>

/* bytes of zeroed memory (pages touched on first use), 2 MiB aligned when large; NULL when out of
 * memory. Free with kiln_huge_free(p, the same bytes). */
void *kiln_huge_alloc(size_t bytes);
void kiln_huge_free(void *p, size_t bytes);

#endif
