/* server/job.h: the requests that go through the scheduler (pool.h): the layer forward (plain
 * and streamed), stateless SDPA, and the session operations that must wait for the session's
 * earlier requests (truncate, fork, delete). Each submit function parses the request, pins its
 * session, queues the job and leaves the answer to the job's callbacks; on any early failure it
 * answers the error itself.
 *
 * Thread rule: loop thread only; the jobs' run callbacks execute on workers and touch only the
 * job.
 */
#ifndef SERVER_JOB_H
#define SERVER_JOB_H

#include "route.h"
#include "session.h"

struct job; /* opaque */

/* POST /v1/attend, /v1/sdpa, /v1/sessions/{id}/truncate, /v1/sessions/{id}/fork: the body is
 * complete in rq->http. */
void job_submit_attend(struct route_req *rq);
/* POST /v1/kv/attend: attention on the caller's q, k and v (a forward without projections). */
void job_submit_kv_attend(struct route_req *rq);
void job_submit_sdpa(struct route_req *rq);
void job_submit_truncate(struct route_req *rq);
void job_submit_fork(struct route_req *rq);

/* GET /v1/sessions/{id}/export: the session as a file (snapshot.h), once its earlier requests
 * are done. PUT /v1/sessions/{id}: recreates a session from such a file (the body). */
void job_submit_export(struct route_req *rq);
/* GET /v1/sessions/{id}/attention: the attention of tokens already cached, recomputed from the
 * cache (--keep-queries) on a worker holding the session's turn. */
void job_submit_attention(struct route_req *rq);
void job_submit_import(struct route_req *rq);

/* DELETE /v1/sessions/{id} for the live session s. */
void job_submit_delete(struct route_req *rq, struct session *s);

/* The job's stream has handed its last event to the socket: run the next step. */
void job_stream_drained(struct job *job);

/* The job's request is closed: drop the pointer; a parked stream stops at its next turn. */
void job_client_gone(struct job *job);

#endif /* SERVER_JOB_H */
