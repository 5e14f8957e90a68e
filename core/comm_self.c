/* The communicator of a world of one (comm.h): what a build without MPI runs on (FLOW_MPI=OFF, for
 * machines that have no MPI, such as a bare GPU image). Every collective over one rank is a copy
 * of this rank's own block; there is no peer to send to. */
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "error.h"

static void copy(void *dst, const void *src, size_t count, flow_dtype dt) {
  if (dst != src && count) memmove(dst, src, count * flow_dtype_size(dt));
}

static int s_allreduce(flow_comm *c, const void *send, void *recv, size_t count, flow_dtype dt) {
  (void)c;
  copy(recv, send, count, dt);
  return 0;
}

static int s_allgatherv(flow_comm *c, const void *send, size_t count, void *recv, const size_t *counts,
                        const size_t *displs, flow_dtype dt) {
  (void)c; (void)counts;
  copy((char *)recv + displs[0] * flow_dtype_size(dt), send, count, dt);
  return 0;
}

static int s_reduce_scatterv(flow_comm *c, const void *send, void *recv, const size_t *counts, flow_dtype dt) {
  (void)c;
  copy(recv, send, counts[0], dt);
  return 0;
}

static int s_alltoall(flow_comm *c, const void *send, void *recv, size_t count, flow_dtype dt) {
  (void)c;
  copy(recv, send, count, dt);
  return 0;
}

static int s_alltoallv(flow_comm *c, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
                       const size_t *rcounts, const size_t *rdispls, flow_dtype dt) {
  (void)c; (void)rcounts;
  size_t es = flow_dtype_size(dt);
  copy((char *)recv + rdispls[0] * es, (const char *)send + sdispls[0] * es, scounts[0], dt);
  return 0;
}

static int s_broadcast(flow_comm *c, void *buf, size_t count, flow_dtype dt, int root) {
  (void)c; (void)buf; (void)count; (void)dt; (void)root;
  return 0;
}

static int no_peer(int peer) { return flow_error_set("communicator: a world of one rank has no rank %d", peer); }

static int s_send(flow_comm *c, const void *buf, size_t count, flow_dtype dt, int peer, int tag) {
  (void)c; (void)buf; (void)count; (void)dt; (void)tag;
  return no_peer(peer);
}

static int s_recv(flow_comm *c, void *buf, size_t count, flow_dtype dt, int peer, int tag) {
  (void)c; (void)buf; (void)count; (void)dt; (void)tag;
  return no_peer(peer);
}

/* Messages to oneself arrive in the order they were sent. */
static int s_exchange(flow_comm *c, const flow_comm_msg *sends, int nsend, const flow_comm_msg *recvs, int nrecv,
                      flow_dtype dt, int tag) {
  (void)c; (void)tag;
  if (nsend != nrecv) return flow_error_set("exchange: %d messages sent to oneself but %d received", nsend, nrecv);
  for (int i = 0; i < nsend; i++) {
    if (sends[i].peer != 0 || recvs[i].peer != 0) return no_peer(sends[i].peer != 0 ? sends[i].peer : recvs[i].peer);
    if (sends[i].count != recvs[i].count)
      return flow_error_set("exchange: a message of %zu elements received as %zu", sends[i].count, recvs[i].count);
    copy(recvs[i].buf, sends[i].buf, sends[i].count, dt);
  }
  return 0;
}

static int s_barrier(flow_comm *c) { (void)c; return 0; }

static int s_handshake(flow_comm *c, const char *what, long long v, long long *min, long long *max) {
  (void)c; (void)what;
  *min = *max = v;
  return 0;
}

static int s_minmax(flow_comm *c, long long v, long long *min, long long *max) { return s_handshake(c, NULL, v, min, max); }

static void s_fail(flow_comm *c, const char *what, const char *msg) { (void)c; (void)what; (void)msg; }

static int s_group(flow_comm *c, const int *members, int n, flow_comm **out) {
  (void)c;
  if (n != 1 || members[0] != 0) return flow_error_set("communicator: a world of one rank has only rank 0");
  return (*out = flow_comm_self_new()) ? 0 : -1;
}

static void s_free(flow_comm *c) { free(c); }

/* alltoall_blocks stays NULL: boxing packs blocks itself, and a group of one moves nothing. */
static const flow_comm_ops self_ops = {
  .allreduce = s_allreduce, .allgatherv = s_allgatherv, .reduce_scatterv = s_reduce_scatterv,
  .alltoall = s_alltoall, .alltoallv = s_alltoallv, .broadcast = s_broadcast, .send = s_send, .recv = s_recv,
  .exchange = s_exchange, .barrier = s_barrier,
  .handshake = s_handshake, .fail = s_fail, .minmax = s_minmax, .group = s_group, .free = s_free,
};

flow_comm *flow_comm_self_new(void) {
  flow_comm *c = calloc(1, sizeof *c);
  if (!c) {
    flow_error_set("communicator: out of memory");
    return NULL;
  }
  c->ops = &self_ops;
  c->rank = 0;
  c->size = 1;
  return c;
}
