/* hadamard.h — the randomized Hadamard rotation used by TurboQuant: x -> H·D·x / sqrt(n) with D a
 * fixed ±1 diagonal and H the Walsh-Hadamard matrix (n a power of two). Orthonormal, so its
 * inverse D·H·x / sqrt(n) preserves dot products and norms. */
#ifndef KILN_KV_HADAMARD_H
#define KILN_KV_HADAMARD_H

#include <stdbool.h>

bool kiln_is_pow2(int n);
/* In-place unnormalized fast Walsh-Hadamard transform of x[n] (n a power of two). */
void kiln_fwht(float *x, int n);
/* Fixed pseudo-random sign of coordinate i (+1 or -1), the same for every call. */
float kiln_hadamard_sign(int i);
/* x <- H·D·x / sqrt(n). */
void kiln_hadamard_rotate(float *x, int n);
/* x <- D·H·x / sqrt(n), the inverse of kiln_hadamard_rotate. */
void kiln_hadamard_unrotate(float *x, int n);

#endif
