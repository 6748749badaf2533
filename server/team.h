/* server/team.h: the helper threads the workers share. A worker's forward hands its parallel
 * parts (projection slices, attention tasks) to the team's executor and runs them itself too;
 * helpers join in only while fewer threads compute than there are cores. So a request alone on
 * an idle server uses every core, and a full server (every worker computing) runs no helper:
 * work-conserving, never oversubscribed. */
#ifndef SERVER_TEAM_H
#define SERVER_TEAM_H

#include <stdint.h>

#include "../engine/attn.h"

struct team; /* thread-safe */

struct team_stats {
    uint64_t batches;      /* executor calls that were shared (two tasks or more) */
    uint64_t tasks;        /* tasks of those calls */
    uint64_t helped_tasks; /* of which the helpers ran */
};

/* Starts n_cores - 1 helpers (none for n_cores <= 1: the executor then runs everything on the
 * calling thread). Returns 0, or -1 when a thread or the memory could not be had. */
int team_create(int32_t n_cores, struct team **out);

/* Stops and joins the helpers. No executor call may be running. NULL is a no-op. */
void team_destroy(struct team *t);

/* The executor for attn_workspace_create; its calls block until all their tasks ran. */
attn_executor team_executor(struct team *t);

/* A worker thread starts (enter) and ends (leave) computing: the team counts it as using a core
 * from enter to leave, so helpers leave that core alone. */
void team_enter(struct team *t);
void team_leave(struct team *t);

void team_get_stats(struct team *t, struct team_stats *out);

#endif /* SERVER_TEAM_H */
