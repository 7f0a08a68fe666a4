/* AVX2 pieces of the row tiles: a tile row's accumulators and their sums. Every function is compiled for AVX2,
 * FMA and F16C whatever the build's flags; callers check vectors() first. */
#ifndef MOECHAT_CPU_AVX2_H
#define MOECHAT_CPU_AVX2_H

#if defined(__x86_64__) && defined(__GNUC__)
#define VECTORIZED 1
#include <immintrin.h>

#include "experts.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* With one or two inputs a row's FMAs would wait on each other: they spread over up to 4 accumulators each. */
#define CHAINS(n) ((n) == 1 ? 4 : (n) == 2 ? 2 : 1)

struct accumulators {
    __m256 v[TILE_TOKENS][4];
};

INLINE AVX2 void clear(struct accumulators *a, const int n) {
    for (int i = 0; i < n; i++)
        for (int c = 0; c < CHAINS(n); c++) a->v[i][c] = _mm256_setzero_ps();
}

/* a[i] += w . x[i][k .. k + 8 * count) for count <= 4 weight vectors. */
INLINE AVX2 void multiply_add(struct accumulators *a, const __m256 *w, const int count, const float *const *x,
                              int64_t k, const int n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < count; j++)
            a->v[i][j % CHAINS(n)] = _mm256_fmadd_ps(w[j], _mm256_loadu_ps(x[i] + k + 8 * j), a->v[i][j % CHAINS(n)]);
}

/* function(arguments..., n) with n a constant 1 .. TILE_TOKENS, so that the accumulators stay in registers. */
#define WITH_CONSTANT_TOKENS(n, function, ...)                                                                       \
    switch (n) {                                                                                                     \
        case 1: function(__VA_ARGS__, 1); break;                                                                     \
        case 2: function(__VA_ARGS__, 2); break;                                                                     \
        case 3: function(__VA_ARGS__, 3); break;                                                                     \
        case 4: function(__VA_ARGS__, 4); break;                                                                     \
        case 5: function(__VA_ARGS__, 5); break;                                                                     \
        case 6: function(__VA_ARGS__, 6); break;                                                                     \
        case 7: function(__VA_ARGS__, 7); break;                                                                     \
        default: function(__VA_ARGS__, 8); break;                                                                    \
    }

INLINE AVX2 float sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

INLINE AVX2 float total(const struct accumulators *a, int i, const int n) {
    __m256 v = a->v[i][0];
    for (int c = 1; c < CHAINS(n); c++) v = _mm256_add_ps(v, a->v[i][c]);
    return sum(v);
}

#endif
#endif
