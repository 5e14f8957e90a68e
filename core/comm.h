/* Ranks and communicators: MPI bootstrap (rank, world size) and a small collective interface with
 * one vtable per backend (MPI here for host memory; an NCCL backend plugs into the same table).
 * Counts and displacements are in elements; reductions are sums. */
#ifndef FLOW_COMM_H
#define FLOW_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "dtype.h"

typedef struct flow_comm flow_comm;

/* A strided block of a buffer: `rows` runs of `run` elements, runs `stride` elements apart,
 * starting at element `offset`. */
typedef struct flow_comm_block {
  size_t offset, rows, run, stride;
} flow_comm_block;

/* One point-to-point message of an exchange: count elements to or from peer. */
typedef struct flow_comm_msg {
  int peer;
  void *buf;
  size_t count;
} flow_comm_msg;

typedef struct flow_comm_ops {
  int (*allreduce)(flow_comm *c, const void *send, void *recv, size_t count, flow_dtype dt);
  /* recv holds every rank's block: rank q's at displs[q], counts[q] elements */
  int (*allgatherv)(flow_comm *c, const void *send, size_t count, void *recv, const size_t *counts,
                    const size_t *displs, flow_dtype dt);
  /* send holds one block per rank, back to back (counts[q] elements for rank q); the sum of
   * everyone's block for this rank lands in recv */
  int (*reduce_scatterv)(flow_comm *c, const void *send, void *recv, const size_t *counts, flow_dtype dt);
  /* every rank sends `count` elements to every rank (blocks back to back, in rank order) */
  int (*alltoall)(flow_comm *c, const void *send, void *recv, size_t count, flow_dtype dt);
  /* per-peer counts; the choice between alltoall and alltoallv must be the same on every rank */
  int (*alltoallv)(flow_comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                   void *recv, const size_t *rcounts, const size_t *rdispls, flow_dtype dt);
  /* all-to-all of strided blocks: sblocks[q] of send goes to rank q, rank q's lands in rblocks[q]
   * of recv; the backend moves strided data without a separate packing pass. Optional (NULL when
   * the backend cannot, as NCCL): boxing then packs the blocks and uses alltoallv. */
  int (*alltoall_blocks)(flow_comm *c, const void *send, const flow_comm_block *sblocks, void *recv,
                         const flow_comm_block *rblocks, flow_dtype dt);
  int (*broadcast)(flow_comm *c, void *buf, size_t count, flow_dtype dt, int root);
  int (*send)(flow_comm *c, const void *buf, size_t count, flow_dtype dt, int peer, int tag);
  int (*recv)(flow_comm *c, void *buf, size_t count, flow_dtype dt, int peer, int tag);
  /* post every send and receive, then wait for all (no ordering deadlocks) */
  int (*exchange)(flow_comm *c, const flow_comm_msg *sends, int nsend, const flow_comm_msg *recvs, int nrecv,
                  flow_dtype dt, int tag);
  int (*barrier)(flow_comm *c);
  /* The handshake that precedes data movement: the agreement check, a barrier and the liveness
   * check in one. Min and max of v over the communicator. It waits by polling, at most
   * flow_comm_timeout() seconds, then fails naming the ranks that did not arrive and where the
   * others are; a peer's `fail` makes it fail on every rank with that peer's message. `what` names
   * this rank's op in messages. */
  int (*handshake)(flow_comm *c, const char *what, long long v, long long *min, long long *max);
  /* This rank failed in `what` with message msg: the others' next handshake on c fails with it.
   * Returns at once (a failing rank does not wait for its peers). */
  void (*fail)(flow_comm *c, const char *what, const char *msg);
  /* The handshake for callers with no op to name ("agreement check"). */
  int (*minmax)(flow_comm *c, long long v, long long *min, long long *max);
  /* A communicator over the given members (indices into this one, in order); called by the
   * members only. */
  int (*group)(flow_comm *c, const int *members, int n, flow_comm **out);
  void (*free)(flow_comm *c);
  /* A message with `tag` from peer (-1: any) that has already arrived, received into buf (cap bytes
   * at most): its sender, or -1 when none is there. Never waits. NULL when the backend has none. */
  int (*poll)(flow_comm *c, void *buf, size_t cap, int tag, int peer);
  /* The handshakes made on c so far (each rank counts them: they must agree); set != NULL sets it. */
  unsigned long long (*seq)(flow_comm *c, const unsigned long long *set);
} flow_comm_ops;

struct flow_comm {
  const flow_comm_ops *ops;
  void *impl;
  int rank, size;
};

/* ---- notices: the REPL's failed line --------------------------------------------------------------
 * In the REPL, a line that failed on one rank must fail at once on the others. A handshake over the
 * world learns of it through the failing rank's `fail`; a wait on any other communicator (a
 * placement of some ranks) polls the world for a notice the failing rank sent every rank, and gives
 * up on it, naming the rank and its message. Giving up leaves that communicator's handshake count
 * behind on some ranks: at the end of the line every rank calls flow_comm_resync, which sets each
 * communicator's count to the largest its members hold (older messages are then dropped). */
/* Notices of line `epoch` count from now (older ones are dropped), in this thread's waits. */
void flow_comm_notices_begin(unsigned long long epoch);
/* Tell every other rank of the world that this rank's line failed with msg. */
void flow_comm_notify_all(const char *msg);
/* 0 when no notice of this line has come; else -1 with the error "[rank r] what: rank k failed: msg".
 * Only for waits on a communicator other than the world (c; NULL: a group being made), on the main
 * channel. */
int flow_comm_noticed(flow_comm *c, const char *what);
/* Notices stop counting; those still queued are dropped. */
void flow_comm_notices_end(void);
/* Collective over the world: every communicator's handshake count becomes the largest among its
 * members' (after waits that gave up on a notice). */
int flow_comm_resync(void);
/* Ctrl-C in the REPL (async-signal-safe): a handshake waiting on its peers gives up now, as at
 * FLOW_TIMEOUT (the protocol keeps every rank in step), saying it was interrupted. 0 clears it. */
void flow_comm_set_interrupted(int on);
int flow_comm_interrupted(void);

/* When this thread's last handshake failed because a peer had failed (its `fail`), that peer's rank
 * in the handshake's communicator; else -1. */
int flow_comm_failed_rank(void);
void flow_comm_forget_failure(void);

/* How long a handshake or a transfer may wait for its peers before it fails (seconds; FLOW_TIMEOUT,
 * default 300). A blocking data collective (it runs after a handshake saw every rank arrive) still
 * running flow_comm_grace() seconds past that (FLOW_WATCHDOG_GRACE, default 10) means a peer died
 * or stopped inside it: a watchdog thread then ends the job (MPI_Abort) with a message naming the
 * collective. */
double flow_comm_timeout(void);
void flow_comm_set_timeout(double seconds);
double flow_comm_grace(void);

/* The world: the launched ranks' in a rank of `flowlua --ranks n` (comm_local.c), MPI's when
 * launched by mpirun/srun (or FLOW_MPI=1, or MPI already running), else a world of one without MPI
 * (comm_self.c); idempotent. */
int flow_comm_init(void);
/* `flowlua --ranks n`: fork n rank processes joined by comm_local.c's backend, whose world is then
 * flow_comm_init's. Returns 0 in each rank; the launching process waits for them and exits with the
 * first failing rank's status, ending the others (0 when all succeed). -1 + error when n < 1. */
int flow_comm_launch_local(int n, const char *prog);
/* Start MPI now and make its world this process's world (a singleton without a launcher); for a
 * user who asks for MPI. Error in a build without MPI, or after MPI was finalized. */
int flow_comm_init_mpi(void);
/* Whether the world runs on MPI (raw MPI calls are valid). */
bool flow_comm_uses_mpi(void);
/* Finalise MPI when this process started it (also at exit, if the state was never closed);
 * frees every cached communicator. */
void flow_comm_finalize(void);
/* End every rank of a multi-rank MPI world now with this exit code (MPI_Abort), for an error one
 * rank cannot recover from: a finalize would wait forever on peers blocked in a collective.
 * Returns (doing nothing) in a world of one, where the caller exits as usual. */
void flow_comm_abort(int code);
int flow_comm_rank(void);
int flow_comm_size(void);
flow_comm *flow_comm_world(void);
/* Every rank's process id and node (a hash of its host name), indexed by rank: gathered over the
 * world on the first call, which is therefore collective (MPI's start makes it, to name ranks that
 * die). NULL + error when the gather failed. */
typedef struct flow_comm_proc {
  long host, pid;
} flow_comm_proc;
const flow_comm_proc *flow_comm_procs(void);
/* This rank's index among the ranks on its node, and their number (collective over the world). */
int flow_comm_node_local(int *rank, int *size);

/* Bytes between ranks of c, for text (the REPL's lines, printed messages); collectives over c.
 * allgather: every rank's buffer, back to back in rank order, into *all (malloc'd, NUL after the
 * end) and each rank's length into *lens (malloc'd, c->size entries). broadcast: root's buffer of
 * *len bytes to every rank; on the others *buf becomes a malloc'd copy (NUL after the end). A
 * negative *len sends no bytes, only itself (the REPL's end of input). 0, or -1 + error. */
int flow_comm_allgather_bytes(flow_comm *c, const void *buf, size_t len, char **all, size_t **lens);
int flow_comm_broadcast_bytes(flow_comm *c, char **buf, long long *len, int root);

/* A communicator of one rank (the world of a build without MPI). */
flow_comm *flow_comm_self_new(void);

/* The cached communicator over these world ranks (in this order), made on first use; the world
 * itself for 0 .. size-1. Only members may ask; NULL + error otherwise. */
flow_comm *flow_comm_for_ranks(const int *ranks, int n);
/* The communicator channel of this thread (0 by default). Threads that issue collectives at the
 * same time (a graph's forward and backward collective streams) each use their own channel:
 * flow_comm_for_ranks then returns a separate communicator over the same ranks, so two threads'
 * collectives never match each other. Returns the previous channel. */
int flow_comm_set_channel(int channel);
int flow_comm_channel(void);

#endif
