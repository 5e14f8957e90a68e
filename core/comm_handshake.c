/* The handshake that precedes every data movement of the MPI backend (comm.h): the agreement
 * check, a barrier, the liveness check with FLOW_TIMEOUT and the failure channel in one. */
#ifdef FLOW_HAVE_MPI
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_mpi.h"
#include "comm_backend.h"
#include "error.h"

/* ---- the handshake: agreement, liveness and the failure channel ---------------------------------
 * Point to point over the control communicator, in a star: every rank sends the leader (rank 0 of
 * the communicator) a small record (the handshake's number on this communicator, its value, its
 * op), and the leader answers each with the verdict (min and max of the values, or who failed, or
 * that it gave up). Point to point rather than an all-reduce, because a wait that times out can
 * then name the ranks whose record did not come and cancel its receives, which a collective
 * cannot; a star, because a rank moves on only on the leader's word, so all move on or none do.
 * - A failing rank sends a record (or, as the leader, a verdict) marked failed, with its message,
 *   and goes on without waiting; the others raise with that message.
 * - The leader gives up after FLOW_TIMEOUT: its verdict names the ranks that did not arrive, and a
 *   late rank finds it waiting. The others give up 2 s later (the leader itself did not answer)
 *   and withdraw their record, which a late leader checks before it lets anyone move data.
 * - Messages of a handshake a rank failed or gave up carry an older number and are dropped. */

enum { TAG_RECORD = 1, TAG_VERDICT = 2, TAG_WITHDRAW = 3 };
typedef flow_comm_record record;

flow_comm_record *flow_comm_record_new(void) { return malloc(sizeof(record)); }

/* Wait for this rank's previous sends to be out, then send r as this handshake's message to `to`
 * (-1: every peer). */
static int send_record(flow_comm *c, int tag, int to, const record *r) {
  flow_comm_mpi *im = flow_comm_mpi_of(c);
  int n = c->size, done = 0;
  for (int k = 0; k < 100000 && !done; k++) MPI_Testall(n, im->sends, &done, MPI_STATUSES_IGNORE);
  if (!done) { /* a send still under way (a stopped peer): let it finish with its own buffer */
    for (int q = 0; q < n; q++)
      if (im->sends[q] != MPI_REQUEST_NULL) MPI_Request_free(&im->sends[q]);
    flow_comm_keep_unsent(im->out);
    im->out = malloc(sizeof *im->out);
    if (!im->out) return flow_error_set("handshake: out of memory");
  }
  memcpy(im->out, r, offsetof(record, msg));
  snprintf(im->out->msg, sizeof im->out->msg, "%s", r->msg);
  im->out->seq = im->seq;
  int bytes = (int)(offsetof(record, msg) + strlen(im->out->msg) + 1);
  for (int q = 0; q < n; q++) {
    if (q == c->rank || (to >= 0 && q != to)) continue;
    int e = MPI_Isend(im->out, bytes, MPI_BYTE, q, tag, im->ctl, &im->sends[q]);
    if (e != MPI_SUCCESS) return flow_comm_mpi_fail("handshake", e);
  }
  return 0;
}

/* Receive into the records of the ranks whose req is active until each holds this handshake's
 * number (older ones are dropped and received again), or the time runs out: 1 then, with the
 * requests still active. */
static int await(flow_comm *c, const char *what, int tag, int n, record *got, MPI_Request *req, double timeout,
                 double *waited) {
  flow_comm_mpi *im = flow_comm_mpi_of(c);
  int left = 0, idx[n];
  for (int q = 0; q < n; q++) left += req[q] != MPI_REQUEST_NULL;
  flow_comm_backoff b;
  flow_comm_backoff_start(&b);
  *waited = 0;
  while (left > 0) {
    int k = 0, e = MPI_Testsome(n, req, &k, idx, MPI_STATUSES_IGNORE);
    if (e != MPI_SUCCESS) return flow_comm_mpi_fail("handshake", e);
    for (int i = 0; i < (k == MPI_UNDEFINED ? 0 : k); i++) {
      int q = idx[i];
      if (got[q].seq < im->seq) e = MPI_Irecv(&got[q], (int)sizeof got[q], MPI_BYTE, q, tag, im->ctl, &req[q]);
      else if (got[q].seq > im->seq)
        return flow_error_set("[rank %d] handshake: rank %d is at handshake %llu but this rank at %llu: the ranks are "
                              "out of step", c->rank, q, got[q].seq, im->seq);
      else left--;
      if (e != MPI_SUCCESS) return flow_comm_mpi_fail("handshake", e);
    }
    if (left > 0 && ((*waited = flow_comm_backoff_pause(&b)) > timeout || flow_comm_interrupted())) return 1;
    if (left > 0 && *waited > 1e-3 && flow_comm_noticed(c, what) != 0) return -1; /* the REPL: a failed line */
  }
  return 0;
}

/* A member that gave up on this handshake (the leader was late): its withdraw message, if one came.
 * Open MPI's probe matches before it progresses, so probe a few times. */
static bool withdrawn(flow_comm *c, int *who) {
  flow_comm_mpi *im = flow_comm_mpi_of(c);
  for (int tries = 0; tries < 4; tries++) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_WITHDRAW, im->ctl, &flag, &st) != MPI_SUCCESS) return false;
    if (!flag) continue;
    unsigned long long seq;
    MPI_Recv(&seq, 1, MPI_UNSIGNED_LONG_LONG, st.MPI_SOURCE, TAG_WITHDRAW, im->ctl, MPI_STATUS_IGNORE);
    if (seq == im->seq) { *who = st.MPI_SOURCE; return true; }
    tries = -1; /* an old one: look again */
  }
  return false;
}

/* The leader: gather every record, then send the verdict to every peer (also to ranks that did not
 * arrive, which find it when they do). v: the verdict. */
static int lead(flow_comm *c, const char *what, long long mine, record *v) {
  flow_comm_mpi *im = flow_comm_mpi_of(c);
  int n = c->size, rc = 0;
  record *got = malloc((size_t)n * sizeof *got);
  MPI_Request *req = malloc((size_t)n * sizeof *req);
  if (!got || !req) { free(got); free(req); return flow_error_set("handshake: out of memory"); }
  for (int q = 0; q < n && rc == 0; q++) {
    req[q] = MPI_REQUEST_NULL;
    got[q].seq = 0;
    if (q == c->rank) continue;
    int e = MPI_Irecv(&got[q], (int)sizeof got[q], MPI_BYTE, q, TAG_RECORD, im->ctl, &req[q]);
    if (e != MPI_SUCCESS) rc = flow_comm_mpi_fail("handshake", e);
  }
  double waited = 0;
  int late = rc == 0 ? await(c, what, TAG_RECORD, n, got, req, flow_comm_timeout(), &waited) : -1;
  int who = -1, *state = calloc((size_t)n, sizeof *state);
  if (!state) rc = flow_error_set("handshake: out of memory");
  if (late) flow_comm_drop_requests(n, req, NULL); /* a record that came meanwhile still counts */
  if (late >= 0 && rc == 0) {
    for (int q = 0; q < n; q++) state[q] = q == c->rank || got[q].seq == im->seq ? FLOW_HS_ARRIVED : FLOW_HS_LATE;
    if (!late) withdrawn(c, &who);
    flow_comm_verdict(v, c, im->seq, what, mine, got, state, waited, who);
  } else {
    rc = -1;
  }
  free(state);
  if (rc == 0) rc = send_record(c, TAG_VERDICT, -1, v);
  free(got);
  free(req);
  return rc;
}

/* A member: send the record to the leader (rank 0), wait for its verdict v. */
static int follow(flow_comm *c, const char *what, long long mine, record *v) {
  flow_comm_mpi *im = flow_comm_mpi_of(c);
  flow_comm_record_fill(v, im->seq, mine, FLOW_HS_OK, c->rank, what, "");
  int rc = send_record(c, TAG_RECORD, 0, v);
  if (rc != 0) return rc;
  MPI_Request req;
  v->seq = 0;
  int e = MPI_Irecv(v, (int)sizeof *v, MPI_BYTE, 0, TAG_VERDICT, im->ctl, &req);
  if (e != MPI_SUCCESS) return flow_comm_mpi_fail("handshake", e);
  double waited;
  int late = await(c, what, TAG_VERDICT, 1, v, &req, flow_comm_timeout() + 2, &waited); /* the leader gives up first */
  if (late == 0) return 0;
  if (late < 0) { flow_comm_drop_requests(1, &req, NULL); return -1; }
  MPI_Send(&im->seq, 1, MPI_UNSIGNED_LONG_LONG, 0, TAG_WITHDRAW, im->ctl);
  /* a leader that came just now may have answered before it saw the withdraw: its verdict, if it
   * comes at once, holds for every rank (a cancel, if it saw it) */
  double more;
  if (await(c, what, TAG_VERDICT, 1, v, &req, 0.5, &more) == 0) return 0;
  flow_comm_drop_requests(1, &req, NULL);
  if (flow_comm_interrupted())
    return flow_error_set("[rank %d] %s: interrupted after %.0f s waiting for rank 0, which leads this handshake",
                          c->rank, what, waited);
  return flow_error_set("[rank %d] %s: waited %.0f s (FLOW_TIMEOUT + 2 s) for rank 0, which leads this handshake and "
                        "did not answer (stopped, stuck, failed outside a global op or took another path)",
                        c->rank, what, waited);
}

int flow_comm_handshake_mpi(flow_comm *c, const char *what, long long v, long long *min, long long *max) {
  *min = *max = v;
  if (c->size < 2) return 0;
  flow_comm_mpi_of(c)->seq++;
  record r;
  int rc = c->rank == 0 ? lead(c, what, v, &r) : follow(c, what, v, &r);
  return rc != 0 ? rc : flow_comm_verdict_result(c, what, &r, min, max);
}

void flow_comm_fail_mpi(flow_comm *c, const char *what, const char *msg) {
  if (c->size < 2) return;
  flow_comm_mpi_of(c)->seq++;
  char keep[1024];
  snprintf(keep, sizeof keep, "%s", flow_error_get());
  record r;
  flow_comm_record_fill(&r, 0, 0, FLOW_HS_FAILED, c->rank, what, msg);
  send_record(c, c->rank == 0 ? TAG_VERDICT : TAG_RECORD, c->rank == 0 ? -1 : 0, &r);
  flow_error_set("%s", keep);
}

#endif
