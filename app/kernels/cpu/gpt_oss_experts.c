/* GPT-OSS routed experts of one layer: MXFP4 gate_up [2W, H] (gate rows even, up rows odd) plus its bias, the
 * clamped SwiGLU, MXFP4 down [H, W] plus its bias, each expert's output weighted by the router. The torch reference
 * is gpt_oss_experts_torch (app/kernels/gpt_oss_experts.py). */
#include <math.h>

#include "experts.h"

struct gpt_oss_experts {
    int64_t width, hidden;
    float limit, alpha;
    struct arena gate_up_blocks, gate_up_scales, gate_up_bias, down_blocks, down_scales, down_bias;
};

static struct matrix mxfp4_matrix(const struct arena *blocks, const struct arena *scales, int64_t slot, int64_t rows,
                                  int64_t cols) {
    return (struct matrix){blocks->base + slot * blocks->slot_bytes, DTYPE_U8, rows, cols,
                           scales->base + slot * scales->slot_bytes, DTYPE_U8, SCALE_NONE, 0, 0};
}

static struct matrix down_of(const void *experts, int64_t slot) {
    const struct gpt_oss_experts *e = experts;
    return mxfp4_matrix(&e->down_blocks, &e->down_scales, slot, e->hidden, e->width);
}

static float clamped_swiglu(float gate, float up, float limit, float alpha) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    return (up + 1.0f) * gate / (1.0f + expf(-alpha * gate));
}

/* activations[pair][j] for the thread's features [begin, end) of every pair */
static void gate_up(const struct routing *r, const struct pairs *p, const void *experts, float *activations,
                    int64_t begin, int64_t end) {
    const struct gpt_oss_experts *e = experts;
    for (int64_t g = 0; g < p->groups; g++) {
        const struct matrix m = mxfp4_matrix(&e->gate_up_blocks, &e->gate_up_scales, p->slot[g], 2 * e->width,
                                             r->hidden);
        const uint8_t *bias = e->gate_up_bias.base + p->slot[g] * e->gate_up_bias.slot_bytes;
        for (int64_t p0 = p->first[g]; p0 < p->first[g + 1]; p0 += TILE_TOKENS) {
            const int n = p->first[g + 1] - p0 < TILE_TOKENS ? (int)(p->first[g + 1] - p0) : TILE_TOKENS;
            const float *x[TILE_TOKENS];
            for (int i = 0; i < n; i++) x[i] = r->x + p->token[p0 + i] * r->hidden;
            for (int64_t j = begin; j < end; j += TILE_ROWS / 2) {
                const int64_t count = end - j < TILE_ROWS / 2 ? end - j : TILE_ROWS / 2;
                float y[TILE_TOKENS * TILE_ROWS];
                mxfp4_tile(&m, 2 * j, 2 * count, x, n, y);
                for (int i = 0; i < n; i++)
                    for (int64_t q = 0; q < count; q++) {
                        const float gate = y[i * TILE_ROWS + 2 * q] + load_float(bias, e->gate_up_bias.dtype, 2 * (j + q));
                        const float up = y[i * TILE_ROWS + 2 * q + 1] + load_float(bias, e->gate_up_bias.dtype, 2 * (j + q) + 1);
                        activations[(p0 + i) * e->width + j + q] = clamped_swiglu(gate, up, e->limit, e->alpha);
                    }
            }
        }
    }
}

int gpt_oss_experts(const struct routing *r, const void *experts) {
    const struct gpt_oss_experts *e = experts;
    if (e->hidden != r->hidden || r->hidden % 32 || e->width % 32) return STATUS_BAD_ARGUMENT;
    const struct layer layer = {e->width, gate_up, down_of, mxfp4_tile, &e->down_bias};
    return run_layer(r, e, &layer);
}
