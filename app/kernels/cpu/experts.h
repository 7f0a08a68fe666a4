/* What the CPU expert kernels share: the arguments Python passes through ctypes (library.py mirrors these
 * structs), a layer's (token, pick) pairs grouped by expert, the row tiles of each weight format, and the split
 * of rows between threads. Experts are read where they lie (cache slots or the host store: slot s of a tensor
 * starts at base + s * slot_bytes); everything is computed in float32. */
#ifndef MOECHAT_CPU_EXPERTS_H
#define MOECHAT_CPU_EXPERTS_H

#include <stdint.h>
#include <string.h>

enum dtype { DTYPE_F32 = 0, DTYPE_BF16 = 1, DTYPE_U8 = 2, DTYPE_FP8_E4M3 = 3 };
enum scale_layout { SCALE_NONE = 0, SCALE_PER_ROW = 1, SCALE_BLOCKS = 2 };
enum status { STATUS_OK = 0, STATUS_BAD_ARGUMENT = 1, STATUS_NO_MEMORY = 2 };

struct arena {
    const uint8_t *base;
    int64_t slot_bytes;
    int32_t dtype;
};

/* x [T, H] float32, slots [T, k] int64 (-1: skip), weights [T, k] float32 -> out [T, H] float32 (overwritten).
 * The rows are split over `team` where there is one (the CPU tier's, team.h), else over `threads` OpenMP threads. */
struct routing {
    int64_t tokens, picks, hidden;
    const float *x;
    const int64_t *slots;
    const float *weights;
    float *out;
    int32_t threads;
    struct team *team;
};

/* The routed pairs sorted by slot: group g holds pairs [first[g], first[g + 1]) of slot slot[g]. */
struct pairs {
    int64_t count, groups;
    int64_t *token;
    float *weight;
    int64_t *slot;
    int64_t *first;
};

#define TILE_TOKENS 8
#define TILE_ROWS 16

/* A weight matrix [rows, cols] of one expert, rows being output features: FP8 e4m3 or bf16 with an optional scale
 * (per row [rows, 1], or per block [ceil(rows / block_rows), ceil(cols / block_cols)]), or MXFP4 (blocks
 * [rows, cols / 32, 16] with scales [rows, cols / 32]). */
struct matrix {
    const uint8_t *weight;
    int32_t dtype;
    int64_t rows, cols;
    const uint8_t *scale;
    int32_t scale_dtype, scale_layout;
    int64_t block_rows, block_cols;
};

/* y[i * TILE_ROWS + (r - first)] = m[r] . x[i] for `count` <= TILE_ROWS rows from `first` and n <= TILE_TOKENS
 * inputs x[i] [cols]. */
void mxfp4_tile(const struct matrix *m, int64_t first, int64_t count, const float *const *x, int n, float *y);
void dense_tile(const struct matrix *m, int64_t first, int64_t count, const float *const *x, int n, float *y);

typedef void (*tile_function)(const struct matrix *m, int64_t first, int64_t count, const float *const *x, int n,
                              float *y);
typedef struct matrix (*matrix_of_slot)(const void *experts, int64_t slot);

/* A layer's two halves. `gate_up` writes activations [pairs, width] for features [begin, end) of every pair; the
 * down projection then gives out[t] = sum over t's pairs of weight * (down(slot) . activation + bias[slot]), bias
 * (float32 or bf16 [H] a slot) NULL for none. Threads split the features, then out's rows. */
struct layer {
    int64_t width;
    void (*gate_up)(const struct routing *r, const struct pairs *p, const void *experts, float *activations,
                    int64_t begin, int64_t end);
    matrix_of_slot down;
    tile_function tile;
    const struct arena *bias;
};

int run_layer(const struct routing *r, const void *experts, const struct layer *layer);

/* The layer kernels: `experts` is the struct of gpt_oss_experts.c or glu_experts.c (library.py mirrors them). */
int gpt_oss_experts(const struct routing *r, const void *experts);
int glu_experts(const struct routing *r, const void *experts);

/* base[index] of a float32 or bf16 tensor */
static inline float load_float(const uint8_t *base, int32_t dtype, int64_t index) {
    float value;
    if (dtype == DTYPE_BF16) {
        uint16_t half;
        memcpy(&half, base + 2 * index, 2);
        const uint32_t bits = (uint32_t)half << 16;
        memcpy(&value, &bits, 4);
    } else {
        memcpy(&value, base + 4 * index, 4);
    }
    return value;
}
/* The instruction sets the tiles can use, each a superset of the one before: the best the CPU has is chosen at load */
enum vectors { VECTORS_PORTABLE = 0, VECTORS_AVX2 = 1, VECTORS_AVX512 = 2 };
int vectors(void);
int use_vectors(int wanted); /* tests run every path the CPU has; returns the one now used, `wanted` or the best below */

#endif
