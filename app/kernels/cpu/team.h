/* A team of threads that stays awake between the CPU expert tier's layer calls (cpu_share.c): a call comes about
 * every layer of a decode step, far too often for threads that sleep between them (an OpenMP team wakes each worker
 * through the kernel, and throttles its spinning when other teams, torch's, hold threads too). Its workers spin
 * while calls keep coming and nap once none came for a while, so an idle engine leaves the cores alone. */
#ifndef MOECHAT_CPU_TEAM_H
#define MOECHAT_CPU_TEAM_H

#include <stdint.h>

typedef void (*team_job)(void *context, int64_t chunk);

struct team;

/* `threads` in all, the caller's among them; NULL where that is fewer than two or the threads cannot start. */
struct team *team_start(int threads);
/* job(context, c) for every chunk c < chunks, spread over the team and the caller; returns when all are done. */
void team_run(struct team *team, team_job job, void *context, int64_t chunks);
void team_stop(struct team *team);

/* How a waiting thread passes time: spinning within SPIN_SECONDS of `since`, in short naps after. */
#define SPIN_SECONDS 0.05
double seconds(void);
void wait_briefly(double since);

#endif
