/* What the files of the MPI backend share: comm.c (bootstrap and collectives), comm_handshake.c
 * (the handshake before data moves) and comm_watchdog.c (ending a job stuck in a collective).
 * Internal to core/, and only in a build with MPI. */
#ifndef FLOW_COMM_MPI_H
#define FLOW_COMM_MPI_H
#ifdef FLOW_HAVE_MPI

#include <mpi.h>
#include <stdbool.h>
#include <time.h>

#include "comm.h"
#include "comm_backend.h"

typedef struct flow_comm_record flow_comm_record;

/* A communicator's MPI state. Handshakes go over a duplicate of the data communicator, so their
 * small messages never meet data messages. */
typedef struct flow_comm_mpi {
  MPI_Comm comm, ctl;
  unsigned long long seq;  /* handshakes made on it so far: the same count on every rank */
  flow_comm_record *out;   /* this rank's last handshake message, read by MPI until its sends complete */
  MPI_Request *sends;      /* one per rank (MPI_REQUEST_NULL for itself) */
} flow_comm_mpi;

static inline flow_comm_mpi *flow_comm_mpi_of(flow_comm *c) { return c->impl; }

/* Keeps a send buffer that MPI may still read (its request freed, the send in flight) until
 * MPI_Finalize, then frees it; false when out of memory (the buffer is then left as it is). */
bool flow_comm_keep_unsent(void *buf);

/* "[rank r] what failed: <MPI's message>" as the current error; returns -1. */
int flow_comm_mpi_fail(const char *what, int rc);

/* Cancel the receives still pending (arrived[i]: request i completed after all); sends go on in
 * the background. */
void flow_comm_drop_requests(int n, MPI_Request *req, bool *arrived);

/* The handshake and the failure notice of comm.h's interface (comm_handshake.c). */
int flow_comm_handshake_mpi(flow_comm *c, const char *what, long long v, long long *min, long long *max);
void flow_comm_fail_mpi(flow_comm *c, const char *what, const char *msg);
flow_comm_record *flow_comm_record_new(void); /* malloc'ed, uninitialised */

/* Mark this thread as inside the blocking collective `what` (a string that outlives the call),
 * and as out of it (comm_watchdog.c). */
void flow_comm_watch_enter(const char *what);
void flow_comm_watch_leave(void);

#endif
#endif
