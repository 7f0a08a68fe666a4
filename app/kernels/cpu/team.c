/* The CPU expert tier's team of threads (team.h). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "team.h"

struct team {
    int workers; /* threads besides the caller's */
    pthread_t *threads;
    int64_t generation; /* counted up by each run: the workers wait for it to change */
    int64_t next_chunk, chunks;
    int busy; /* workers still in the current run */
    int stop;
    team_job job;
    void *context;
};

double seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec + now.tv_nsec * 1e-9;
}

void wait_briefly(double since) {
    if (seconds() - since > SPIN_SECONDS) {
        const struct timespec nap = {0, 100000};
        nanosleep(&nap, NULL);
    } else {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    }
}

static void take_chunks(struct team *t) {
    int64_t chunk;
    while ((chunk = __atomic_fetch_add(&t->next_chunk, 1, __ATOMIC_RELAXED)) < t->chunks) t->job(t->context, chunk);
}

static void *work(void *argument) {
    struct team *t = argument;
    int64_t seen = 0;
    double last = seconds();
    for (;;) {
        int64_t generation;
        while ((generation = __atomic_load_n(&t->generation, __ATOMIC_ACQUIRE)) == seen) {
            if (__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) return NULL;
            wait_briefly(last);
        }
        seen = generation;
        take_chunks(t);
        __atomic_sub_fetch(&t->busy, 1, __ATOMIC_RELEASE);
        last = seconds();
    }
}

struct team *team_start(int threads) {
    if (threads < 2) return NULL;
    struct team *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->threads = calloc(threads - 1, sizeof *t->threads);
    if (!t->threads) {
        free(t);
        return NULL;
    }
    for (; t->workers < threads - 1; t->workers++) {
        if (pthread_create(&t->threads[t->workers], NULL, work, t)) break;
    }
    if (t->workers == 0) {
        team_stop(t);
        return NULL;
    }
    return t;
}

void team_run(struct team *t, team_job job, void *context, int64_t chunks) {
    t->job = job;
    t->context = context;
    t->chunks = chunks;
    __atomic_store_n(&t->next_chunk, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&t->busy, t->workers, __ATOMIC_RELAXED);
    __atomic_add_fetch(&t->generation, 1, __ATOMIC_RELEASE);
    take_chunks(t);
    const double start = seconds();
    while (__atomic_load_n(&t->busy, __ATOMIC_ACQUIRE) > 0) wait_briefly(start);
}

void team_stop(struct team *t) {
    __atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < t->workers; i++) pthread_join(t->threads[i], NULL);
    free(t->threads);
    free(t);
}
