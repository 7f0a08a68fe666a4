/* SiLU-gated routed experts of one layer (GLM, DeepSeek): gate and up [W, H], down [H, W], FP8 e4m3 with a scale
 * per row or per block, bf16 or float32; each expert's output weighted by the router. The torch reference is
 * glu_experts_torch (app/kernels/glu_experts.py). */
#include <math.h>
#include <stddef.h>

#include "experts.h"

enum projection { GATE = 0, UP = 1, DOWN = 2 };

struct glu_experts {
    int64_t width, hidden;
    int32_t scale_layout;
    int64_t block_rows, block_cols;
    struct arena weights[3], scales[3]; /* gate, up, down */
};

static struct matrix projection_of(const struct glu_experts *e, enum projection which, int64_t slot) {
    const int64_t rows = which == DOWN ? e->hidden : e->width, cols = which == DOWN ? e->width : e->hidden;
    const struct arena *w = &e->weights[which], *s = &e->scales[which];
    const int32_t layout = w->dtype == DTYPE_FP8_E4M3 ? e->scale_layout : SCALE_NONE;
    return (struct matrix){w->base + slot * w->slot_bytes, w->dtype, rows, cols,
                           layout == SCALE_NONE ? NULL : s->base + slot * s->slot_bytes, s->dtype, layout,
                           e->block_rows, e->block_cols};
}

static struct matrix down_of(const void *experts, int64_t slot) { return projection_of(experts, DOWN, slot); }

/* activations[pair][j] = silu(gate . x) * (up . x) for the thread's features [begin, end) of every pair */
static void gate_up(const struct routing *r, const struct pairs *p, const void *experts, float *activations,
                    int64_t begin, int64_t end) {
    const struct glu_experts *e = experts;
    for (int64_t g = 0; g < p->groups; g++) {
        const struct matrix gate = projection_of(e, GATE, p->slot[g]), up = projection_of(e, UP, p->slot[g]);
        for (int64_t p0 = p->first[g]; p0 < p->first[g + 1]; p0 += TILE_TOKENS) {
            const int n = p->first[g + 1] - p0 < TILE_TOKENS ? (int)(p->first[g + 1] - p0) : TILE_TOKENS;
            const float *x[TILE_TOKENS];
            for (int i = 0; i < n; i++) x[i] = r->x + p->token[p0 + i] * r->hidden;
            for (int64_t j = begin; j < end; j += TILE_ROWS) {
                const int64_t count = end - j < TILE_ROWS ? end - j : TILE_ROWS;
                float gates[TILE_TOKENS * TILE_ROWS], ups[TILE_TOKENS * TILE_ROWS];
                dense_tile(&gate, j, count, x, n, gates);
                dense_tile(&up, j, count, x, n, ups);
                for (int i = 0; i < n; i++)
                    for (int64_t q = 0; q < count; q++) {
                        const float gate_value = gates[i * TILE_ROWS + q];
                        activations[(p0 + i) * e->width + j + q] = gate_value / (1.0f + expf(-gate_value)) * ups[i * TILE_ROWS + q];
                    }
            }
        }
    }
}

int glu_experts(const struct routing *r, const void *experts) {
    const struct glu_experts *e = experts;
    if (e->hidden != r->hidden || (e->scale_layout == SCALE_BLOCKS && (e->block_rows < 1 || e->block_cols < 1)))
        return STATUS_BAD_ARGUMENT;
    const struct layer layer = {e->width, gate_up, down_of, dense_tile, NULL};
    return run_layer(r, e, &layer);
}
