/* The NCCL communicator backend of the CUDA plugin (core/comm.h's vtable over device memory): MPI
 * bootstraps each communicator, NCCL moves the device data. The core keeps the cache of them and
 * the start-up probe (core/nccl.c). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "../error.h"
#include "runtime.h"

typedef struct nccl_impl {
  ncclComm_t comm;
  flow_comm *boot;   /* the MPI communicator over the same ranks */
  bool owns_boot;    /* made by n_group (else comm.c's cache owns it) */
  int device;
} nccl_impl;

static nccl_impl *impl_of(flow_comm *c) { return c->impl; }

static int nccl_check(ncclResult_t r, const char *call) {
  if (r == ncclSuccess) return 0;
  return flow_error_set("%s: %s (NCCL error %d)", call, ncclGetErrorString(r), (int)r);
}

static int nccl_type(flow_dtype dt, ncclDataType_t *out) {
  switch (dt) {
  case FLOW_F32: *out = ncclFloat32; return 0;
  case FLOW_F64: *out = ncclFloat64; return 0;
  case FLOW_F16: *out = ncclFloat16; return 0;
  case FLOW_BF16: *out = ncclBfloat16; return 0;
  case FLOW_I64: *out = ncclInt64; return 0;
  case FLOW_I32: *out = ncclInt32; return 0;
  case FLOW_U8: case FLOW_BOOL: *out = ncclUint8; return 0;
  default: return flow_error_set("nccl: dtype %s cannot be communicated", flow_dtype_name(dt));
  }
}

/* Every collective: the collective stream waits for the compute work so far, runs, and the
 * compute stream waits for it. */
static int begin(flow_comm *c, flow_dtype dt, ncclDataType_t *t, cudaStream_t *s) {
  nccl_impl *im = impl_of(c);
  if (nccl_type(dt, t) != 0 || flow_cuda_comm_wait_compute(im->device) != 0) return -1;
  *s = (cudaStream_t)flow_cuda_comm_stream(im->device);
  return 0;
}
static int end(flow_comm *c, int rc) {
  if (rc != 0) return rc;
  return flow_cuda_compute_wait_comm(impl_of(c)->device);
}

static size_t esize(flow_dtype dt) { return flow_dtype_size(dt); }

static int n_allreduce(flow_comm *c, const void *send, void *recv, size_t count, flow_dtype dt) {
  ncclDataType_t t;
  cudaStream_t s;
  if (begin(c, dt, &t, &s) != 0) return -1;
  return end(c, nccl_check(ncclAllReduce(send, recv, count, t, ncclSum, impl_of(c)->comm, s), "ncclAllReduce"));
}

static bool equal_counts(const size_t *counts, const size_t *displs, int n) {
  for (int q = 0; q < n; q++)
    if (counts[q] != counts[0] || (displs && displs[q] != (size_t)q * counts[0])) return false;
  return true;
}

/* Unequal blocks: one broadcast per rank, grouped. */
static int n_allgatherv(flow_comm *c, const void *send, size_t count, void *recv, const size_t *counts,
                        const size_t *displs, flow_dtype dt) {
  ncclDataType_t t;
  cudaStream_t s;
  if (begin(c, dt, &t, &s) != 0) return -1;
  ncclComm_t comm = impl_of(c)->comm;
  if (equal_counts(counts, displs, c->size))
    return end(c, nccl_check(ncclAllGather(send, recv, count, t, comm, s), "ncclAllGather"));
  int rc = nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int q = 0; q < c->size && rc == 0; q++)
    rc = nccl_check(ncclBroadcast(send, (char *)recv + displs[q] * esize(dt), counts[q], t, q, comm, s), "ncclBroadcast");
  int rc2 = nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  return end(c, rc ? rc : rc2);
}

/* Unequal blocks: one reduce per rank (rooted there), grouped. */
static int n_reduce_scatterv(flow_comm *c, const void *send, void *recv, const size_t *counts, flow_dtype dt) {
  ncclDataType_t t;
  cudaStream_t s;
  if (begin(c, dt, &t, &s) != 0) return -1;
  ncclComm_t comm = impl_of(c)->comm;
  if (equal_counts(counts, NULL, c->size))
    return end(c, nccl_check(ncclReduceScatter(send, recv, counts[0], t, ncclSum, comm, s), "ncclReduceScatter"));
  int rc = nccl_check(ncclGroupStart(), "ncclGroupStart");
  size_t off = 0;
  for (int q = 0; q < c->size && rc == 0; q++) {
    rc = nccl_check(ncclReduce((const char *)send + off * esize(dt), recv, counts[q], t, ncclSum, q, comm, s), "ncclReduce");
    off += counts[q];
  }
  int rc2 = nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  return end(c, rc ? rc : rc2);
}

static int n_alltoallv(flow_comm *c, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
                       const size_t *rcounts, const size_t *rdispls, flow_dtype dt) {
  ncclDataType_t t;
  cudaStream_t s;
  if (begin(c, dt, &t, &s) != 0) return -1;
  ncclComm_t comm = impl_of(c)->comm;
  size_t es = esize(dt);
  int rc = nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int q = 0; q < c->size && rc == 0; q++) {
    if (scounts[q]) rc = nccl_check(ncclSend((const char *)send + sdispls[q] * es, scounts[q], t, q, comm, s), "ncclSend");
    if (rc == 0 && rcounts[q]) rc = nccl_check(ncclRecv((char *)recv + rdispls[q] * es, rcounts[q], t, q, comm, s), "ncclRecv");
  }
  int rc2 = nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  return end(c, rc ? rc : rc2);
}

static int n_alltoall(flow_comm *c, const void *send, void *recv, size_t count, flow_dtype dt) {
  ncclDataType_t t;
  cudaStream_t s;
  if (begin(c, dt, &t, &s) != 0) return -1;
  ncclComm_t comm = impl_of(c)->comm;
  size_t bytes = count * esize(dt);
  int rc = nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int q = 0; q < c->size && rc == 0 && count; q++) {
    rc = nccl_check(ncclSend((const char *)send + q * bytes, count, t, q, comm, s), "ncclSend");
    if (rc == 0) rc = nccl_check(ncclRecv((char *)recv + q * bytes, count, t, q, comm, s), "ncclRecv");
  }
  int rc2 = nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  return end(c, rc ? rc : rc2);
}

static int n_broadcast(flow_comm *c, void *buf, size_t count, flow_dtype dt, int root) {
  ncclDataType_t t;
  cudaStream_t s;
  if (begin(c, dt, &t, &s) != 0) return -1;
  return end(c, nccl_check(ncclBroadcast(buf, buf, count, t, root, impl_of(c)->comm, s), "ncclBroadcast"));
}

/* NCCL keeps point-to-point messages in order per peer, so the tag is not needed. */
static int n_send(flow_comm *c, const void *buf, size_t count, flow_dtype dt, int peer, int tag) {
  (void)tag;
  ncclDataType_t t;
  cudaStream_t s;
  if (begin(c, dt, &t, &s) != 0) return -1;
  return end(c, nccl_check(ncclSend(buf, count, t, peer, impl_of(c)->comm, s), "ncclSend"));
}

static int n_recv(flow_comm *c, void *buf, size_t count, flow_dtype dt, int peer, int tag) {
  (void)tag;
  ncclDataType_t t;
  cudaStream_t s;
  if (begin(c, dt, &t, &s) != 0) return -1;
  return end(c, nccl_check(ncclRecv(buf, count, t, peer, impl_of(c)->comm, s), "ncclRecv"));
}

/* Host-side agreement goes through MPI; the barrier also drains this rank's GPU work. */
static int n_barrier(flow_comm *c) {
  nccl_impl *im = impl_of(c);
  if (flow_cuda_synchronize(im->device) != 0) return -1;
  return im->boot->ops->barrier(im->boot);
}

static int n_handshake(flow_comm *c, const char *what, long long v, long long *min, long long *max) {
  flow_comm *b = impl_of(c)->boot;
  return b->ops->handshake(b, what, v, min, max);
}

static void n_fail(flow_comm *c, const char *what, const char *msg) {
  flow_comm *b = impl_of(c)->boot;
  b->ops->fail(b, what, msg);
}

static int n_minmax(flow_comm *c, long long v, long long *min, long long *max) {
  flow_comm *b = impl_of(c)->boot;
  return b->ops->minmax(b, v, min, max);
}

/* Every send and receive in one group: NCCL orders them per peer, so the tag is not needed. */
static int n_exchange(flow_comm *c, const flow_comm_msg *sends, int nsend, const flow_comm_msg *recvs, int nrecv,
                      flow_dtype dt, int tag) {
  (void)tag;
  ncclDataType_t t;
  cudaStream_t s;
  if (begin(c, dt, &t, &s) != 0) return -1;
  ncclComm_t comm = impl_of(c)->comm;
  int rc = nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int i = 0; rc == 0 && i < nsend; i++)
    if (sends[i].count) rc = nccl_check(ncclSend(sends[i].buf, sends[i].count, t, sends[i].peer, comm, s), "ncclSend");
  for (int i = 0; rc == 0 && i < nrecv; i++)
    if (recvs[i].count) rc = nccl_check(ncclRecv(recvs[i].buf, recvs[i].count, t, recvs[i].peer, comm, s), "ncclRecv");
  int rc2 = nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  return end(c, rc ? rc : rc2);
}

static int n_group(flow_comm *c, const int *members, int n, flow_comm **out);
static void n_free(flow_comm *c);

static const flow_comm_ops nccl_ops = {
  .allreduce = n_allreduce, .allgatherv = n_allgatherv, .reduce_scatterv = n_reduce_scatterv,
  .alltoall = n_alltoall, .alltoallv = n_alltoallv, /* strided blocks: boxing packs them */
  .broadcast = n_broadcast, .send = n_send, .recv = n_recv, .exchange = n_exchange, .barrier = n_barrier,
  .handshake = n_handshake, .fail = n_fail, .minmax = n_minmax, .group = n_group, .free = n_free,
};

/* An NCCL communicator over the members of boot (an MPI communicator) on GPU `device`. */
static flow_comm *make(flow_comm *boot, int device) {
  if (flow_cuda_set_device(device) != 0) return NULL;
  ncclUniqueId id;
  if (boot->rank == 0 && nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId") != 0) memset(&id, 0, sizeof id);
  /* the id's bytes travel as uint8 over MPI */
  if (boot->ops->broadcast(boot, &id, sizeof id, FLOW_U8, 0) != 0) return NULL;
  flow_comm *c = calloc(1, sizeof *c);
  nccl_impl *im = calloc(1, sizeof *im);
  if (!c || !im) {
    free(c);
    free(im);
    flow_error_set("nccl: out of host memory");
    return NULL;
  }
  if (nccl_check(ncclCommInitRank(&im->comm, boot->size, id, boot->rank), "ncclCommInitRank") != 0) {
    free(c);
    free(im);
    return NULL;
  }
  im->boot = boot;
  im->device = device;
  c->ops = &nccl_ops;
  c->impl = im;
  c->rank = boot->rank;
  c->size = boot->size;
  return c;
}

/* members index into c's ranks. */
static int n_group(flow_comm *c, const int *members, int n, flow_comm **out) {
  flow_comm *sub;
  nccl_impl *im = impl_of(c);
  if (im->boot->ops->group(im->boot, members, n, &sub) != 0) return -1;
  flow_comm *g = make(sub, im->device);
  if (!g) { sub->ops->free(sub); return -1; }
  impl_of(g)->owns_boot = true;
  *out = g;
  return 0;
}

static void n_free(flow_comm *c) {
  if (!c) return;
  nccl_impl *im = impl_of(c);
  ncclCommDestroy(im->comm);
  if (im->owns_boot) im->boot->ops->free(im->boot);
  free(im);
  free(c);
}

flow_comm *flow_cuda_nccl_comm(flow_comm *boot, int device) { return make(boot, device); }
