/* hadamard.c — fast Walsh-Hadamard transform and the randomized rotation built on it. */
#include "kv/hadamard.h"

#include <math.h>
#include <stdint.h>

bool kiln_is_pow2(int n) {
    return n > 0 && (n & (n - 1)) == 0;
}

void kiln_fwht(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

float kiln_hadamard_sign(int i) {
    /* splitmix64 of the index: a fixed, well-mixed sign pattern. */
    uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull + 0x6a09e667f3bcc909ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (z & 1) ? -1.0f : 1.0f;
}

void kiln_hadamard_rotate(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] *= kiln_hadamard_sign(i);
    kiln_fwht(x, n);
    float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i] *= s;
}

void kiln_hadamard_unrotate(float *x, int n) {
    kiln_fwht(x, n);
    float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i] *= s * kiln_hadamard_sign(i);
}
