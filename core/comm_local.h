/* What the two files of `flowlua --ranks N` share: comm_launch.c forks the rank processes, joined
 * by rings in shared memory (comm_ring.c) and a full mesh of Unix-domain sockets, and comm_local.c
 * is the communicator backend over them. Internal to core/. */
#ifndef FLOW_COMM_LOCAL_H
#define FLOW_COMM_LOCAL_H

#include <stdbool.h>

#include "comm.h"
#include "comm_ring.h"

/* This process is rank `rank` of `size` launched ranks; fd[q] is its socket to rank q (fd[rank]
 * unused), shm the rings mapped before the fork, `aborts` the pipe on which it tells the launcher
 * that it ends the job. Called once, in the rank process, before the world is made. */
void flow_comm_local_join(int rank, int size, const int *fd, flow_ring_region *shm, int aborts);

/* What an aborting rank writes on the pipe before it signals the launcher (SIGUSR1), which then
 * ends the others before they fail on seeing it leave. */
typedef struct flow_comm_local_abort_notice {
  int rank, code;
} flow_comm_local_abort_notice;
/* Whether this process is a launched rank. */
bool flow_comm_local_joined(void);
/* The world of the launched ranks; NULL when this process is not one of them. */
flow_comm *flow_comm_local_world(void);
/* End the launched job now with this exit code: the launcher hears of it and ends the other ranks.
 * Returns (doing nothing) when this process is not a launched rank of a job of several. */
void flow_comm_local_abort(int code);

#endif
