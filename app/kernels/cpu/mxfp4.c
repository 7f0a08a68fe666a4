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
/* The 32 e2m1 values of one block, in order, as 4 vectors: each code picks the high byte of its value as a half
 * (every e2m1 value's low byte is zero) and F16C widens the halves. */
INLINE AVX2 void decode_group(const uint8_t *block, __m256 *w) {
    const __m128i half_high = _mm_setr_epi8(0x00, 0x38, 0x3C, 0x3E, 0x40, 0x42, 0x44, 0x46, (char)0x80, (char)0xB8,
                                            (char)0xBC, (char)0xBE, (char)0xC0, (char)0xC2, (char)0xC4, (char)0xC6);
    const __m128i nibble = _mm_set1_epi8(0x0F), zero = _mm_setzero_si128();
    const __m128i bytes = _mm_loadu_si128((const __m128i *)block);
    const __m128i low = _mm_shuffle_epi8(half_high, _mm_and_si128(bytes, nibble));
    const __m128i high = _mm_shuffle_epi8(half_high, _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble));
    const __m128i first = _mm_unpacklo_epi8(low, high), second = _mm_unpackhi_epi8(low, high);
    w[0] = _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, first));
    w[1] = _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, first));
    w[2] = _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, second));
    w[3] = _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, second));
}

/* One or two inputs: each group's products are summed first and scaled once (fewer multiplies than scaling its 32
 * weights, which pays from three inputs on: vector_row). */
INLINE AVX2 void scaled_late(const uint8_t *blocks, const uint8_t *scales, int64_t groups, const float *const *x,
                             float *y, const int n) {
    __m256 acc[TILE_TOKENS];
    for (int i = 0; i < n; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m256 w[4];
        decode_group(blocks + 16 * g, w);
        const __m256 s = _mm256_set1_ps(group_scale(scales[g]));
        for (int i = 0; i < n; i++) {
            const float *xi = x[i] + 32 * g;
            __m256 part = _mm256_mul_ps(w[0], _mm256_loadu_ps(xi));
            __m256 other = _mm256_mul_ps(w[1], _mm256_loadu_ps(xi + 8));
            part = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xi + 16), part);
            other = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xi + 24), other);
            acc[i] = _mm256_fmadd_ps(_mm256_add_ps(part, other), s, acc[i]);
        }
    }
    for (int i = 0; i < n; i++) y[i * TILE_ROWS] = sum(acc[i]);
}

INLINE AVX2 void vector_row(const uint8_t *blocks, const uint8_t *scales, int64_t groups, const float *const *x,
                            float *y, const int n) {
    struct accumulators a;
    clear(&a, n);
    for (int64_t g = 0; g < groups; g++) {
        __m256 w[4];
        decode_group(blocks + 16 * g, w);
        const __m256 s = _mm256_set1_ps(group_scale(scales[g]));
        for (int j = 0; j < 4; j++) w[j] = _mm256_mul_ps(w[j], s);
        multiply_add(&a, w, 4, x, 32 * g, n);
    }
    for (int i = 0; i < n; i++) y[i * TILE_ROWS] = total(&a, i, n);
}

static AVX2 void vector_tile(const struct matrix *m, int64_t first, int64_t count, const float *const *x, int n,
                             float *y) {
    const int64_t groups = m->cols / 32;
    for (int64_t r = 0; r < count; r++) {
        const uint8_t *blocks = m->weight + (first + r) * groups * 16, *scales = m->scale + (first + r) * groups;
        if (n <= 2) {
            WITH_CONSTANT_TOKENS(n, scaled_late, blocks, scales, groups, x, y + r)
        } else {
            WITH_CONSTANT_TOKENS(n, vector_row, blocks, scales, groups, x, y + r)
        }
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
