/* What the communicator backends share, the MPI one (comm.c, comm_handshake.c) and the local one
 * (comm_local.c): the sums of reductions, and the parts of the handshake (comm.h) that do not
 * depend on how its records travel (the record, the leader's verdict from the members' records,
 * what a verdict means to a rank, and the barrier and agreement check made of a handshake).
 * Internal to core/. */
#ifndef FLOW_COMM_BACKEND_H
#define FLOW_COMM_BACKEND_H

#include <stddef.h>
#include <time.h>

#include "comm.h"

/* An error for a sum (all-reduce, reduce-scatter) over a dtype that has none here; 0 if fine. */
int flow_comm_sum_check(const char *what, flow_dtype dt);
/* acc[i] += x[i] for n elements of dt (float16 and bfloat16: in float32, each sum rounded) */
void flow_comm_add_into(void *acc, const void *x, size_t n, flow_dtype dt);

/* An all-reduce made of a backend's reduce-scatter (count / size elements a rank, the first
 * count % size ranks one more) and all-gather: each element is summed once, in rank order, by
 * flow_comm_add_into, and every rank gets the same bits. */
typedef int (*flow_comm_reduce_scatterv_fn)(flow_comm *c, const void *send, void *recv, const size_t *counts,
                                            flow_dtype dt);
typedef int (*flow_comm_allgatherv_fn)(flow_comm *c, const void *send, size_t count, void *recv,
                                       const size_t *counts, const size_t *displs, flow_dtype dt);
int flow_comm_allreduce_by_parts(flow_comm *c, const void *send, void *recv, size_t count, flow_dtype dt,
                                 flow_comm_reduce_scatterv_fn reduce_scatterv, flow_comm_allgatherv_fn allgatherv);

/* Polling with back-off for waits on peers (comm.c): start, then pause between two polls; the
 * pause returns the seconds waited since the start. */
typedef struct flow_comm_backoff {
  struct timespec t0, nap;
  long spins;
} flow_comm_backoff;
void flow_comm_backoff_start(flow_comm_backoff *b);
double flow_comm_backoff_pause(flow_comm_backoff *b);

enum { FLOW_HS_OK, FLOW_HS_FAILED, FLOW_HS_CANCELLED };

/* A member's record for the leader, or the leader's verdict. */
typedef struct flow_comm_record {
  unsigned long long seq;  /* the handshake's number on its communicator */
  long long lo, hi;
  int status, rank;        /* a verdict's FLOW_HS_FAILED: the rank that failed */
  char what[64];           /* the sender's op */
  char msg[768];           /* a failure's or a cancel's message; only its used part need travel */
} flow_comm_record;

void flow_comm_record_fill(flow_comm_record *r, unsigned long long seq, long long v, int status, int rank,
                           const char *what, const char *msg);

/* Where a member's record stands when the leader decides. */
enum { FLOW_HS_ARRIVED, FLOW_HS_LATE, FLOW_HS_EXITED };

/* The leader's verdict v on the members' records got[q], standing as state[q] (its own index
 * skipped): a cancel naming the ranks that exited or did not arrive (after `waited` seconds) and
 * where the others are; else a cancel when member withdrawn_by (>= 0) gave up on the leader; else
 * the first failure; else the min and max of the values, `mine` included. */
void flow_comm_verdict(flow_comm_record *v, const flow_comm *c, unsigned long long seq, const char *what,
                       long long mine, const flow_comm_record *got, const int *state, double waited,
                       int withdrawn_by);

/* What verdict r means on this rank: 0 with min and max, or -1 with the error. */
int flow_comm_verdict_result(const flow_comm *c, const char *what, const flow_comm_record *r, long long *min,
                             long long *max);

/* The agreement check and the barrier, each a handshake (comm.h's minmax and barrier). */
int flow_comm_handshake_minmax(flow_comm *c, long long v, long long *min, long long *max);
int flow_comm_handshake_barrier(flow_comm *c);

#endif
