/* What the two files of `flowlua --ranks N` share: comm_launch.c forks the rank processes, joined
 * by a full mesh of Unix-domain sockets, and comm_local.c is the communicator backend over them.
 * Internal to core/. */
#ifndef FLOW_COMM_LOCAL_H
#define FLOW_COMM_LOCAL_H

#include <stdbool.h>

#include "comm.h"

/* This process is rank `rank` of `size` launched ranks; fd[q] is its socket to rank q (fd[rank]
 * unused). Called once, in the rank process, before the world is made. */
void flow_comm_local_join(int rank, int size, const int *fd);
/* Whether this process is a launched rank. */
bool flow_comm_local_joined(void);
/* The world of the launched ranks; NULL when this process is not one of them. */
flow_comm *flow_comm_local_world(void);
/* End the launched job now with this exit code: the launcher ends the other ranks. Returns (doing
 * nothing) when this process is not a launched rank. */
void flow_comm_local_abort(int code);

#endif
