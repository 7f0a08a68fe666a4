/* MXFP4 row tiles: blocks [rows, cols / 32, 16] hold two e2m1 codes a byte (element 2j in the low nibble, 2j + 1
 * in the high one), scales [rows, cols / 32] mean 2^(s - 127) for their 32 values. */
#include <string.h>

#include "avx512.h"
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

/* A block's 16 bytes, spread so that dword d holds byte d / 2 in its low byte and byte 8 + d / 2 in the next;
 * shifted right by 4 * (d % 2) bits, its low nibble is code d and its bits 8-11 code 16 + d. The spread reads
 * bytes 0-15 only, so the vector's upper bytes may be anything. */
#define SPREAD(d) (d) / 2, 8 + (d) / 2, 0, 0
static const uint8_t SPREAD_BYTES[64] = {SPREAD(0),  SPREAD(1),  SPREAD(2),  SPREAD(3),  SPREAD(4),  SPREAD(5),
                                         SPREAD(6),  SPREAD(7),  SPREAD(8),  SPREAD(9),  SPREAD(10), SPREAD(11),
                                         SPREAD(12), SPREAD(13), SPREAD(14), SPREAD(15)};
static const int32_t NIBBLE_SHIFTS[16] = {0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4};

/* The 32 e2m1 values of one block, in order, as 2 vectors: vpermps looks each code up in E2M1 (it reads an index's
 * low 4 bits only). */
INLINE AVX512 void decode_group_wide(const uint8_t *block, __m512i spread, __m512i shifts, __m512 table, __m512 *w) {
    const __m512i bytes = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)block));
    const __m512i codes = _mm512_srlv_epi32(_mm512_permutexvar_epi8(spread, bytes), shifts);
    w[0] = _mm512_permutexvar_ps(codes, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 8), table);
}

/* group_scale of `count` scale bytes, 16 at a time */
INLINE AVX512 void group_scales_wide(const uint8_t *scales, int64_t count, float *out) {
    for (int64_t k = 0; k < count; k += 16) {
        const __mmask16 mask = count - k >= 16 ? 0xFFFF : (__mmask16)((1u << (count - k)) - 1);
        const __m512i s = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, scales + k));
        const __m512i bits = _mm512_mask_mov_epi32(_mm512_slli_epi32(s, 23), _mm512_cmpeq_epi32_mask(s, _mm512_setzero_si512()),
                                                   _mm512_set1_epi32(0x00400000));
        _mm512_mask_storeu_ps(out + k, mask, _mm512_castsi512_ps(bits));
    }
}

/* One block's 32 products into chain `chain`; as on AVX2, one or two inputs scale their sums, more scale the
 * weights. */
INLINE AVX512 void add_group_wide(struct wide_accumulators *a, const __m512 *w, __m512 s, const float *const *x,
                                  int64_t k, const int chain, const int n) {
    if (n <= 2) {
        for (int i = 0; i < n; i++) {
            const __m512 part = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(x[i] + k + 16),
                                                _mm512_mul_ps(w[0], _mm512_loadu_ps(x[i] + k)));
            a->v[i][chain] = _mm512_fmadd_ps(part, s, a->v[i][chain]);
        }
    } else {
        const __m512 scaled[2] = {_mm512_mul_ps(w[0], s), _mm512_mul_ps(w[1], s)};
        multiply_add_wide(a, scaled, 2, x, k, n);
    }
}

#define SCALES_AT_ONCE 128

INLINE AVX512 void wide_row(const uint8_t *blocks, const uint8_t *scales, int64_t groups, const float *const *x,
                            float *y, const int n) {
    const __m512i spread = _mm512_loadu_si512(SPREAD_BYTES), shifts = _mm512_loadu_si512(NIBBLE_SHIFTS);
    const __m512 table = _mm512_loadu_ps(E2M1);
    struct wide_accumulators a;
    clear_wide(&a, n);
    float scale[SCALES_AT_ONCE];
    for (int64_t g0 = 0; g0 < groups; g0 += SCALES_AT_ONCE) {
        const int64_t g1 = g0 + SCALES_AT_ONCE < groups ? g0 + SCALES_AT_ONCE : groups;
        group_scales_wide(scales + g0, g1 - g0, scale);
        int64_t g = g0;
        for (; g + 2 <= g1; g += 2) {
            __m512 w[2];
            decode_group_wide(blocks + 16 * g, spread, shifts, table, w);
            add_group_wide(&a, w, _mm512_set1_ps(scale[g - g0]), x, 32 * g, 0, n);
            decode_group_wide(blocks + 16 * (g + 1), spread, shifts, table, w);
            add_group_wide(&a, w, _mm512_set1_ps(scale[g + 1 - g0]), x, 32 * (g + 1), 1, n);
        }
        if (g < g1) {
            __m512 w[2];
            decode_group_wide(blocks + 16 * g, spread, shifts, table, w);
            add_group_wide(&a, w, _mm512_set1_ps(scale[g - g0]), x, 32 * g, 0, n);
        }
    }
    for (int i = 0; i < n; i++) y[i * TILE_ROWS] = total_wide(&a, i);
}

static AVX512 void wide_tile(const struct matrix *m, int64_t first, int64_t count, const float *const *x, int n,
                             float *y) {
    const int64_t groups = m->cols / 32;
    for (int64_t r = 0; r < count; r++) {
        const uint8_t *blocks = m->weight + (first + r) * groups * 16, *scales = m->scale + (first + r) * groups;
        WITH_CONSTANT_TOKENS(n, wide_row, blocks, scales, groups, x, y + r)
    }
}
#endif

void mxfp4_tile(const struct matrix *m, int64_t first, int64_t count, const float *const *x, int n, float *y) {
#ifdef VECTORIZED
    if (vectors() == VECTORS_AVX512) {
        wide_tile(m, first, count, x, n, y);
        return;
    }
    if (vectors() == VECTORS_AVX2) {
        vector_tile(m, first, count, x, n, y);
        return;
    }
#endif
    scalar_tile(m, first, count, x, n, y);
}
