/* FP8 e4m3, bf16 and float32 row tiles: weights [rows, cols], an FP8 weight's scale per row [rows, 1] or
 * per block [ceil(rows / block_rows), ceil(cols / block_cols)] (app/quantization.py), float32 or bf16. */
#include <math.h>
#include <string.h>

#include "avx512.h"
#include "experts.h"

static float e4m3_values[256];

/* e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, subnormals, no infinities, S.1111.111 is NaN */
__attribute__((constructor)) static void fill_e4m3_values(void) {
    for (int b = 0; b < 256; b++) {
        const int exponent = (b >> 3) & 15, mantissa = b & 7;
        float value = exponent ? ldexpf(1.0f + mantissa / 8.0f, exponent - 7) : ldexpf(mantissa / 8.0f, -6);
        if (exponent == 15 && mantissa == 7) value = NAN;
        e4m3_values[b] = b & 0x80 ? -value : value;
    }
}

static float weight_at(const struct matrix *m, const uint8_t *row, int64_t k) {
    return m->dtype == DTYPE_FP8_E4M3 ? e4m3_values[row[k]] : load_float(row, m->dtype, k);
}

static int64_t weight_bytes(int32_t dtype) { return dtype == DTYPE_FP8_E4M3 ? 1 : dtype == DTYPE_BF16 ? 2 : 4; }

/* The scale of the weights from column k of row r on (to the end of their block) */
static float scale_at(const struct matrix *m, int64_t r, int64_t k) {
    if (m->scale_layout == SCALE_PER_ROW) return load_float(m->scale, m->scale_dtype, r);
    if (m->scale_layout == SCALE_BLOCKS) {
        const int64_t blocks_per_row = (m->cols + m->block_cols - 1) / m->block_cols;
        return load_float(m->scale, m->scale_dtype, r / m->block_rows * blocks_per_row + k / m->block_cols);
    }
    return 1.0f;
}

static int64_t scale_columns(const struct matrix *m) {
    return m->scale_layout == SCALE_BLOCKS ? m->block_cols : m->cols;
}

static const uint8_t *row_of(const struct matrix *m, int64_t r) {
    return m->weight + r * m->cols * weight_bytes(m->dtype);
}

static void scalar_tile(const struct matrix *m, int64_t first, int64_t count, const float *const *x, int n, float *y) {
    for (int64_t r = first; r < first + count; r++) {
        const uint8_t *row = row_of(m, r);
        for (int i = 0; i < n; i++) {
            float acc = 0.0f;
            for (int64_t k0 = 0; k0 < m->cols; k0 += scale_columns(m)) {
                const int64_t k1 = k0 + scale_columns(m) < m->cols ? k0 + scale_columns(m) : m->cols;
                const float s = scale_at(m, r, k0);
                for (int64_t k = k0; k < k1; k++) acc += weight_at(m, row, k) * s * x[i][k];
            }
            y[i * TILE_ROWS + (r - first)] = acc;
        }
    }
}

#ifdef VECTORIZED
/* 8 weights of `dtype` from column k times s; FP8 goes through half precision: e4m3's bits shifted into a half's
 * are its value times 2^-8, subnormals included, so s carries the 2^8. */
INLINE AVX2 __m256 decode8(const uint8_t *row, int64_t k, __m256 s, const int dtype) {
    if (dtype == DTYPE_F32) return _mm256_mul_ps(_mm256_loadu_ps((const float *)row + k), s);
    if (dtype == DTYPE_FP8_E4M3) {
        const __m128i bytes = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(row + k)));
        const __m128i magnitude = _mm_slli_epi16(_mm_and_si128(bytes, _mm_set1_epi16(0x7F)), 7);
        const __m128i sign = _mm_slli_epi16(_mm_and_si128(bytes, _mm_set1_epi16(0x80)), 8);
        return _mm256_mul_ps(_mm256_cvtph_ps(_mm_or_si128(magnitude, sign)), s);
    }
    const __m256i halves = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * k)));
    return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(halves, 16)), s);
}

INLINE AVX2 void vector_row(const struct matrix *m, int64_t r, const float *const *x, float *y, const int dtype,
                            const int n) {
    const uint8_t *row = row_of(m, r);
    struct accumulators a;
    clear(&a, n);
    float tail[TILE_TOKENS] = {0.0f};
    for (int64_t k0 = 0; k0 < m->cols; k0 += scale_columns(m)) {
        const int64_t k1 = k0 + scale_columns(m) < m->cols ? k0 + scale_columns(m) : m->cols;
        const float s = scale_at(m, r, k0);
        const __m256 vs = _mm256_set1_ps(dtype == DTYPE_FP8_E4M3 ? 256.0f * s : s);
        int64_t k = k0;
        for (; k + 32 <= k1; k += 32) {
            __m256 w[4];
            for (int j = 0; j < 4; j++) w[j] = decode8(row, k + 8 * j, vs, dtype);
            multiply_add(&a, w, 4, x, k, n);
        }
        for (; k + 8 <= k1; k += 8) {
            const __m256 w = decode8(row, k, vs, dtype);
            multiply_add(&a, &w, 1, x, k, n);
        }
        for (; k < k1; k++)
            for (int i = 0; i < n; i++) tail[i] += weight_at(m, row, k) * s * x[i][k];
    }
    for (int i = 0; i < n; i++) y[i * TILE_ROWS] = total(&a, i, n) + tail[i];
}

INLINE AVX2 void vector_rows(const struct matrix *m, int64_t first, int64_t count, const float *const *x, float *y,
                             const int dtype, const int n) {
    for (int64_t r = 0; r < count; r++) vector_row(m, first + r, x, y + r, dtype, n);
}

static AVX2 void vector_tile(const struct matrix *m, int64_t first, int64_t count, const float *const *x, int n,
                             float *y) {
    if (m->dtype == DTYPE_FP8_E4M3) {
        WITH_CONSTANT_TOKENS(n, vector_rows, m, first, count, x, y, DTYPE_FP8_E4M3)
    } else if (m->dtype == DTYPE_BF16) {
        WITH_CONSTANT_TOKENS(n, vector_rows, m, first, count, x, y, DTYPE_BF16)
    } else {
        WITH_CONSTANT_TOKENS(n, vector_rows, m, first, count, x, y, DTYPE_F32)
    }
}

/* decode8 for 16 weights */
INLINE AVX512 __m512 decode16(const uint8_t *row, int64_t k, __m512 s, const int dtype) {
    if (dtype == DTYPE_F32) return _mm512_mul_ps(_mm512_loadu_ps((const float *)row + k), s);
    if (dtype == DTYPE_FP8_E4M3) {
        const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(row + k)));
        const __m256i magnitude = _mm256_slli_epi16(_mm256_and_si256(bytes, _mm256_set1_epi16(0x7F)), 7);
        const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(bytes, _mm256_set1_epi16(0x80)), 8);
        return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_or_si256(magnitude, sign)), s);
    }
    const __m512i halves = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * k)));
    return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(halves, 16)), s);
}

INLINE AVX512 void wide_row(const struct matrix *m, int64_t r, const float *const *x, float *y, const int dtype,
                            const int n) {
    const uint8_t *row = row_of(m, r);
    struct wide_accumulators a;
    clear_wide(&a, n);
    float tail[TILE_TOKENS] = {0.0f};
    for (int64_t k0 = 0; k0 < m->cols; k0 += scale_columns(m)) {
        const int64_t k1 = k0 + scale_columns(m) < m->cols ? k0 + scale_columns(m) : m->cols;
        const float s = scale_at(m, r, k0);
        const __m512 vs = _mm512_set1_ps(dtype == DTYPE_FP8_E4M3 ? 256.0f * s : s);
        int64_t k = k0;
        for (; k + 64 <= k1; k += 64) {
            __m512 w[4];
            for (int j = 0; j < 4; j++) w[j] = decode16(row, k + 16 * j, vs, dtype);
            multiply_add_wide(&a, w, 4, x, k, n);
        }
        for (; k + 16 <= k1; k += 16) {
            const __m512 w = decode16(row, k, vs, dtype);
            multiply_add_wide(&a, &w, 1, x, k, n);
        }
        for (; k < k1; k++)
            for (int i = 0; i < n; i++) tail[i] += weight_at(m, row, k) * s * x[i][k];
    }
    for (int i = 0; i < n; i++) y[i * TILE_ROWS] = total_wide(&a, i) + tail[i];
}

INLINE AVX512 void wide_rows(const struct matrix *m, int64_t first, int64_t count, const float *const *x, float *y,
                             const int dtype, const int n) {
    for (int64_t r = 0; r < count; r++) wide_row(m, first + r, x, y + r, dtype, n);
}

static AVX512 void wide_tile(const struct matrix *m, int64_t first, int64_t count, const float *const *x, int n,
                             float *y) {
    if (m->dtype == DTYPE_FP8_E4M3) {
        WITH_CONSTANT_TOKENS(n, wide_rows, m, first, count, x, y, DTYPE_FP8_E4M3)
    } else if (m->dtype == DTYPE_BF16) {
        WITH_CONSTANT_TOKENS(n, wide_rows, m, first, count, x, y, DTYPE_BF16)
    } else {
        WITH_CONSTANT_TOKENS(n, wide_rows, m, first, count, x, y, DTYPE_F32)
    }
}
#endif

void dense_tile(const struct matrix *m, int64_t first, int64_t count, const float *const *x, int n, float *y) {
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
