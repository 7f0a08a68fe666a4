/* AVX-512 pieces of the row tiles: 16 floats a vector, so a row needs half the decodes and FMAs of AVX2. Every
 * function is compiled for AVX-512 F, BW, VL and VBMI whatever the build's flags; callers check vectors() first. */
#ifndef MOECHAT_CPU_AVX512_H
#define MOECHAT_CPU_AVX512_H

#include "avx2.h"

#ifdef VECTORIZED
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")))

/* Two chains an input: a row's FMAs alternate between them, so that no FMA waits on the one before. */
struct wide_accumulators {
    __m512 v[TILE_TOKENS][2];
};

INLINE AVX512 void clear_wide(struct wide_accumulators *a, const int n) {
    for (int i = 0; i < n; i++) a->v[i][0] = a->v[i][1] = _mm512_setzero_ps();
}

/* a[i] += w . x[i][k .. k + 16 * count) for count <= 4 weight vectors. */
INLINE AVX512 void multiply_add_wide(struct wide_accumulators *a, const __m512 *w, const int count,
                                     const float *const *x, int64_t k, const int n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < count; j++)
            a->v[i][j % 2] = _mm512_fmadd_ps(w[j], _mm512_loadu_ps(x[i] + k + 16 * j), a->v[i][j % 2]);
}

INLINE AVX512 float total_wide(const struct wide_accumulators *a, int i) {
    return _mm512_reduce_add_ps(_mm512_add_ps(a->v[i][0], a->v[i][1]));
}

#endif
#endif
