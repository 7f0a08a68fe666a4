/* A layer's run: pairs grouped by expert, per-thread scratch, the split between threads, the down projection; and
 * the CPU's features. */
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "experts.h"
#include "team.h"

struct pick {
    int64_t slot, position;
};

static int by_slot_then_position(const void *a, const void *b) {
    const struct pick *x = a, *y = b;
    if (x->slot != y->slot) return x->slot < y->slot ? -1 : 1;
    return x->position < y->position ? -1 : x->position > y->position;
}

static _Thread_local void *storage;
static _Thread_local size_t storage_bytes;

static void *thread_storage(size_t bytes) {
    if (bytes > storage_bytes) {
        free(storage);
        storage = malloc(bytes);
        storage_bytes = storage ? bytes : 0;
    }
    return storage;
}

/* The thread's pairs and `floats` floats of scratch for activations; both live until its next call. */
static int group_pairs(const struct routing *r, struct pairs *p, int64_t floats, float **scratch) {
    const int64_t n = r->tokens * r->picks;
    /* picks, then token, weight, slot, first (n + 1), then the scratch floats, each 64-byte aligned */
    const size_t picks = (n * sizeof(struct pick) + 63) & ~(size_t)63, column = (n * 8 + 8 + 63) & ~(size_t)63;
    uint8_t *base = thread_storage(picks + 4 * column + floats * sizeof(float));
    if (!base) return STATUS_NO_MEMORY;
    struct pick *sorted = (struct pick *)base;
    p->token = (int64_t *)(base + picks);
    p->weight = (float *)(base + picks + column);
    p->slot = (int64_t *)(base + picks + 2 * column);
    p->first = (int64_t *)(base + picks + 3 * column);
    *scratch = (float *)(base + picks + 4 * column);
    p->count = 0;
    for (int64_t i = 0; i < n; i++) {
        if (r->slots[i] >= 0) sorted[p->count++] = (struct pick){r->slots[i], i};
    }
    qsort(sorted, p->count, sizeof *sorted, by_slot_then_position);
    p->groups = 0;
    for (int64_t i = 0; i < p->count; i++) {
        if (i == 0 || sorted[i].slot != sorted[i - 1].slot) {
            p->slot[p->groups] = sorted[i].slot;
            p->first[p->groups++] = i;
        }
        p->token[i] = sorted[i].position / r->picks;
        p->weight[i] = r->weights[sorted[i].position];
    }
    p->first[p->groups] = p->count;
    return STATUS_OK;
}

static void down_projection(const struct routing *r, const struct pairs *p, const float *activations,
                            const void *experts, const struct layer *layer, int64_t begin, int64_t end) {
    const int64_t width = layer->width;
    const struct arena *bias = layer->bias;
    for (int64_t t = 0; t < r->tokens; t++) memset(r->out + t * r->hidden + begin, 0, (end - begin) * sizeof(float));
    for (int64_t g = 0; g < p->groups; g++) {
        const struct matrix m = layer->down(experts, p->slot[g]);
        const uint8_t *b = bias ? bias->base + p->slot[g] * bias->slot_bytes : NULL;
        for (int64_t p0 = p->first[g]; p0 < p->first[g + 1]; p0 += TILE_TOKENS) {
            const int n = p->first[g + 1] - p0 < TILE_TOKENS ? (int)(p->first[g + 1] - p0) : TILE_TOKENS;
            const float *x[TILE_TOKENS];
            for (int i = 0; i < n; i++) x[i] = activations + (p0 + i) * width;
            for (int64_t h = begin; h < end; h += TILE_ROWS) {
                const int64_t count = end - h < TILE_ROWS ? end - h : TILE_ROWS;
                float y[TILE_TOKENS * TILE_ROWS];
                layer->tile(&m, h, count, x, n, y);
                for (int i = 0; i < n; i++) {
                    float *out = r->out + p->token[p0 + i] * r->hidden + h;
                    for (int64_t q = 0; q < count; q++)
                        out[q] += p->weight[p0 + i] * (y[i * TILE_ROWS + q] + (b ? load_float(b, bias->dtype, h + q) : 0.0f));
                }
            }
        }
    }
}

static int detected, level;

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((constructor)) static void detect_vectors(void) {
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    const int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi");
    detected = avx512 ? VECTORS_AVX512 : avx2 ? VECTORS_AVX2 : VECTORS_PORTABLE;
    level = detected;
}
#endif

int vectors(void) { return level; }

int use_vectors(int wanted) {
    level = wanted < detected ? wanted : detected;
    return level;
}

/* Rows go out in chunks of CHUNK (a multiple of every layer's granule), taken by whichever thread is free: a thread
 * the system preempts (a GPU engine's host threads share the cores) then delays only its chunk, not the whole call. */
#define CHUNK 64

static int64_t chunk_end(int64_t chunk, int64_t total) {
    const int64_t end = (chunk + 1) * CHUNK;
    return end < total ? end : total;
}

struct layer_call {
    const struct routing *r;
    const struct pairs *p;
    const void *experts;
    const struct layer *layer;
    float *activations;
};

static void gate_up_chunk(void *context, int64_t chunk) {
    const struct layer_call *c = context;
    c->layer->gate_up(c->r, c->p, c->experts, c->activations, chunk * CHUNK, chunk_end(chunk, c->layer->width));
}

static void down_chunk(void *context, int64_t chunk) {
    const struct layer_call *c = context;
    down_projection(c->r, c->p, c->activations, c->experts, c->layer, chunk * CHUNK, chunk_end(chunk, c->r->hidden));
}

int run_layer(const struct routing *r, const void *experts, const struct layer *layer) {
    struct pairs p;
    float *activations;
    if (group_pairs(r, &p, r->tokens * r->picks * layer->width, &activations) != STATUS_OK) return STATUS_NO_MEMORY;
    struct layer_call call = {r, &p, experts, layer, activations};
    const int64_t gate_chunks = (layer->width + CHUNK - 1) / CHUNK, down_chunks = (r->hidden + CHUNK - 1) / CHUNK;
    if (r->team) {
        team_run(r->team, gate_up_chunk, &call, gate_chunks);
        team_run(r->team, down_chunk, &call, down_chunks);
        return STATUS_OK;
    }
#pragma omp parallel num_threads(r->threads) if (r->threads > 1)
    {
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < gate_chunks; c++) gate_up_chunk(&call, c);
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < down_chunks; c++) down_chunk(&call, c);
    }
    return STATUS_OK;
}
