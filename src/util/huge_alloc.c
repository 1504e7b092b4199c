/* huge_alloc.c — anonymous mmap with MADV_HUGEPAGE (see huge_alloc.h). Sizes under 2 MiB come
 * from calloc (a huge page would be mostly empty), and so does everything under ASan. */
#include "util/huge_alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)

/* Under AddressSanitizer everything comes from calloc, so overflows still hit a redzone. */
#if defined(__SANITIZE_ADDRESS__)
#define HUGE_MIN ((size_t)-1)
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HUGE_MIN ((size_t)-1)
#endif
#endif
#ifndef HUGE_MIN
#define HUGE_MIN HUGE_PAGE
#endif

void *kiln_huge_alloc(size_t bytes) {
    if (bytes < HUGE_MIN) return calloc(1, bytes ? bytes : 1);
    /* over-map by one huge page so the start can be aligned, then give back the ends */
    size_t len = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    uint8_t *raw =
        mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    size_t tail = (size_t)(raw + len + HUGE_PAGE - (p + len));
    if (tail) munmap(p + len, tail);
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE); /* advice only: without THP the pages are small */
#endif
    return p;
}

void kiln_huge_free(void *p, size_t bytes) {
    if (!p) return;
    if (bytes < HUGE_MIN) {
        free(p);
        return;
    }
    munmap(p, (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
}
