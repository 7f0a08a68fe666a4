/* The host's side of the CPU expert tier (app/engine/experts/cpu_tier.py): a loop, on a thread of its own, that
 * answers the device's requests. The device writes a layer's CPU share into page-locked memory (the pairs' host
 * store slots and weights, the hidden states in float32), then a new ticket into control[REQUEST]; the loop runs the
 * layer's expert kernel on those pairs with its team of threads (team.h), writes the result, then the ticket into
 * control[DONE], which the device waits for (app/kernels/cpu_share.py). It and its team nap once no request came for
 * a while, so an idle engine leaves the cores alone; control[STOP] ends them. */
#include "experts.h"
#include "team.h"

enum control { REQUEST = 0, DONE = 1, STOP = 2, TOKENS = 3, STATUS = 4 };
enum kernel { GPT_OSS = 0, GLU = 1 };

struct cpu_share {
    int64_t *control; /* [8] int64, written by both sides */
    const int64_t *slots; /* [T_MAX, k] */
    const float *weights; /* [T_MAX, k] */
    const float *x; /* [T_MAX, H] */
    float *out; /* [T_MAX, H] */
    int64_t picks, hidden;
    int32_t threads, kernel;
    const void *experts; /* struct gpt_oss_experts or struct glu_experts over the host store's arenas */
};

int serve_cpu_share(const struct cpu_share *s) {
    int64_t *control = s->control;
    struct team *team = team_start(s->threads);
    int64_t done = __atomic_load_n(&control[DONE], __ATOMIC_ACQUIRE);
    double last = seconds();
    for (;;) {
        int64_t request;
        while ((request = __atomic_load_n(&control[REQUEST], __ATOMIC_ACQUIRE)) == done) {
            if (__atomic_load_n(&control[STOP], __ATOMIC_ACQUIRE)) {
                if (team) team_stop(team);
                return 0;
            }
            wait_briefly(last);
        }
        const struct routing r = {__atomic_load_n(&control[TOKENS], __ATOMIC_ACQUIRE), s->picks, s->hidden, s->x,
                                  s->slots, s->weights, s->out, 1, team};
        const int status = s->kernel == GLU ? glu_experts(&r, s->experts) : gpt_oss_experts(&r, s->experts);
        if (status) __atomic_store_n(&control[STATUS], status, __ATOMIC_RELEASE);
        __atomic_store_n(&control[DONE], request, __ATOMIC_RELEASE);
        done = request;
        last = seconds();
    }
}
