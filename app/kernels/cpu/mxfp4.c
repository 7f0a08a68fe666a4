/* MXFP4 row tiles: blocks [rows, cols / 32, 16] hold two e2m1 codes a byte (element 2j in the low nibble, 2j + 1
 * in the high one), scales [rows, cols / 32] mean 2^(s - 127) for their 32 values. */
#include <string.h>

#include "avx2.h"
#include "experts.h"

static const float E2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* 2^(s - 127) exactly, s = 0 (a subnormal) included */
static float group_scale(uint8_t s) {
    const uint32_t bits = s ? (uint32_t)s << 23 : 0x00400000u;
    float value;
    memcpy(&value, &bits, 4);
    return value;
}

static void scalar_tile(const struct matrix *m, int64_t first, int64_t count, const float *const *x, int n, float *y) {
    const int64_t groups = m->cols / 32;
    for (int64_t r = 0; r < count; r++) {
        const uint8_t *blocks = m->weight + (first + r) * groups * 16, *scales = m->scale + (first + r) * groups;
        for (int i = 0; i < n; i++) {
            float acc = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                float part = 0.0f;
                for (int b = 0; b < 16; b++) {
                    const uint8_t byte = blocks[16 * g + b];
                    part += E2M1[byte & 15] * x[i][32 * g + 2 * b] + E2M1[byte >> 4] * x[i][32 * g + 2 * b + 1];
                }
                acc += group_scale(scales[g]) * part;
            }
            y[i * TILE_ROWS + r] = acc;
        }
    }
}

#ifdef VECTORIZED
/* The 32 values of one block times their scale, in order, as 4 vectors. */
INLINE AVX2 void decode_group(const uint8_t *block, uint8_t scale, __m256 *w) {
    const __m128i doubled = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);  /* 2 x e2m1 */
    const __m128i nibble = _mm_set1_epi8(0x0F);
    const __m128i bytes = _mm_loadu_si128((const __m128i *)block);
    const __m128i low = _mm_shuffle_epi8(doubled, _mm_and_si128(bytes, nibble));
    const __m128i high = _mm_shuffle_epi8(doubled, _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble));
    const __m128i first = _mm_unpacklo_epi8(low, high), second = _mm_unpackhi_epi8(low, high);
    const __m256 s = _mm256_set1_ps(0.5f * group_scale(scale));
    w[0] = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first)));
    w[1] = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(first, 8))));
    w[2] = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second)));
    w[3] = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(second, 8))));
}

INLINE AVX2 void vector_row(const uint8_t *blocks, const uint8_t *scales, int64_t groups, const float *const *x,
                            float *y, const int n) {
    struct accumulators a;
    clear(&a, n);
    for (int64_t g = 0; g < groups; g++) {
        __m256 w[4];
        decode_group(blocks + 16 * g, scales[g], w);
        multiply_add(&a, w, 4, x, 32 * g, n);
    }
    for (int i = 0; i < n; i++) y[i * TILE_ROWS] = total(&a, i, n);
}

static AVX2 void vector_tile(const struct matrix *m, int64_t first, int64_t count, const float *const *x, int n,
                             float *y) {
    const int64_t groups = m->cols / 32;
    for (int64_t r = 0; r < count; r++) {
        const uint8_t *blocks = m->weight + (first + r) * groups * 16, *scales = m->scale + (first + r) * groups;
        WITH_CONSTANT_TOKENS(n, vector_row, blocks, scales, groups, x, y + r)
    }
}
#endif

void mxfp4_tile(const struct matrix *m, int64_t first, int64_t count, const float *const *x, int n, float *y) {
#ifdef VECTORIZED
    if (has_avx2()) {
        vector_tile(m, first, count, x, n, y);
        return;
    }
#endif
    scalar_tile(m, first, count, x, n, y);
}
