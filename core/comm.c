/* Rank bootstrap with MPI and the MPI backend of the communicator interface (comm.h). A build
 * without MPI (FLOW_MPI=OFF) is a world of one on comm_self.c's backend. */
#include "comm.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "error.h"

static flow_comm *world;

/* Communicators made for rank lists, kept for the life of the process (a handful exist). */
typedef struct cached {
  int n;
  int *ranks;
  flow_comm *comm;
  struct cached *next;
} cached;
static cached *cache;

static void free_cached(void) {
  while (cache) {
    cached *c = cache;
    cache = c->next;
    c->comm->ops->free(c->comm);
    free(c->ranks);
    free(c);
  }
}

static double timeout_s = -1;

void flow_comm_set_timeout(double seconds) { timeout_s = seconds; }

double flow_comm_timeout(void) {
  if (timeout_s <= 0) {
    const char *e = getenv("FLOW_TIMEOUT");
    timeout_s = e && atof(e) > 0 ? atof(e) : 300;
  }
  return timeout_s;
}

#ifdef FLOW_HAVE_MPI
#include <mpi.h>

/* MPI keeps allocations until exit by design, in components it loads and unloads itself, where
 * LeakSanitizer's fast unwinder cannot see whose they are: its set-up and tear-down are not ours
 * to check. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
static void lsan_off(void) { __lsan_disable(); }
static void lsan_on(void) { __lsan_enable(); }
/* MPI's progress threads allocate in components MPI_Finalize unloads; check for leaks while the
 * components are still there to name (the check at exit is then skipped). */
static void lsan_check_now(void) { __lsan_do_leak_check(); }
#else
static void lsan_off(void) {}
static void lsan_on(void) {}
static void lsan_check_now(void) {}
#endif

static bool we_started;

/* ---- MPI backend ------------------------------------------------------------------------------ */

/* A communicator's MPI state. Handshakes go over a duplicate of the data communicator, so their
 * small messages never meet data messages. */
typedef struct record record;
typedef struct mpi_impl {
  MPI_Comm comm, ctl;
  unsigned long long seq; /* handshakes made on it so far: the same count on every rank */
  record *out;            /* this rank's last record, read by MPI until its sends complete */
  MPI_Request *sends;     /* one per rank (MPI_REQUEST_NULL for itself) */
} mpi_impl;

static mpi_impl *impl_of(flow_comm *c) { return c->impl; }
static MPI_Comm mpi(flow_comm *c) { return impl_of(c)->comm; }

static MPI_Datatype mpi_type(flow_dtype dt) {
  switch (dt) {
  case FLOW_F32: return MPI_FLOAT;
  case FLOW_F64: return MPI_DOUBLE;
  case FLOW_I64: return MPI_INT64_T;
  case FLOW_I32: return MPI_INT32_T;
  case FLOW_F16: case FLOW_BF16: return MPI_UINT16_T;
  default: return MPI_UINT8_T;
  }
}

static int mpi_fail(const char *what, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return flow_error_set("[rank %d] %s failed: %s", flow_comm_rank(), what, msg);
}

/* ---- watchdog ------------------------------------------------------------------------------------
 * Data collectives run blocking, at the speed of MPI's tuned algorithms (its non-blocking ones are
 * slower), after a handshake saw every rank arrive. A peer that dies or stops between the two would
 * leave the others inside the collective for good: each thread marks when it entered one, and a
 * watchdog thread ends the job when a mark is older than FLOW_TIMEOUT + 10 s. The marks cost a
 * clock read per collective. */

#define WATCH_SLOTS 64
static struct watch {
  _Atomic long long since_ns; /* 0: not in a collective */
  const char *_Atomic what;
} watch[WATCH_SLOTS];
static atomic_int watch_used;
static _Thread_local int watch_slot = -1;
static pthread_once_t watch_once = PTHREAD_ONCE_INIT;

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void *watchdog(void *arg) {
  (void)arg;
  for (;;) {
    struct timespec nap = {0, 250000000};
    nanosleep(&nap, NULL);
    long long now = now_ns(), limit = (long long)((flow_comm_timeout() + 10) * 1e9);
    int used = atomic_load(&watch_used);
    for (int i = 0; i < used && i < WATCH_SLOTS; i++) {
      long long since = atomic_load(&watch[i].since_ns);
      if (since == 0 || now - since <= limit) continue;
      fprintf(stderr, "[rank %d] %s: no progress for %.0f s (FLOW_TIMEOUT %.0f s + 10 s): a peer rank died or "
              "stopped inside this collective, or never called it; ending the job\n", flow_comm_rank(),
              atomic_load(&watch[i].what), (double)(now - since) * 1e-9, flow_comm_timeout());
      fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, EXIT_FAILURE);
    }
  }
  return NULL;
}

static void watchdog_start(void) {
  pthread_t t;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  lsan_off();
  pthread_create(&t, &a, watchdog, NULL);
  lsan_on();
  pthread_attr_destroy(&a);
}

static void watch_enter(const char *what) {
  if (watch_slot < 0) {
    if (flow_comm_size() < 2) return;
    pthread_once(&watch_once, watchdog_start);
    watch_slot = atomic_fetch_add(&watch_used, 1);
  }
  if (watch_slot >= WATCH_SLOTS) return; /* more threads than slots: this one goes unwatched */
  atomic_store(&watch[watch_slot].what, what);
  atomic_store(&watch[watch_slot].since_ns, now_ns());
}

static void watch_leave(void) {
  if (watch_slot >= 0 && watch_slot < WATCH_SLOTS) atomic_store(&watch[watch_slot].since_ns, 0);
}

/* A blocking MPI call, watched; its failure is an error naming `what`. */
#define CHECK(what, call) do { watch_enter(what); int rc_ = (call); watch_leave(); \
                               if (rc_ != MPI_SUCCESS) return mpi_fail(what, rc_); } while (0)

/* MPI counts are ints: convert, refusing what does not fit. */
static int to_ints(const char *what, const size_t *v, int n, int *out) {
  for (int i = 0; i < n; i++) {
    if (v[i] > INT_MAX) return flow_error_set("%s: a block of %zu elements is too large for MPI", what, v[i]);
    out[i] = (int)v[i];
  }
  return 0;
}

static bool equal_blocks(const size_t *counts, const size_t *displs, int n) {
  for (int i = 0; i < n; i++)
    if (counts[i] != counts[0] || (displs && displs[i] != (size_t)i * counts[0])) return false;
  return true;
}

static int sum_check(const char *what, flow_dtype dt) {
  if (dt == FLOW_F16 || dt == FLOW_BF16 || dt == FLOW_BOOL)
    return flow_error_set("%s: partial sums of %s tensors are not supported (cast to float32 first)",
                          what, flow_dtype_name(dt));
  return 0;
}

static int m_allreduce(flow_comm *c, const void *send, void *recv, size_t count, flow_dtype dt) {
  if (sum_check("all-reduce", dt)) return -1;
  if (count > INT_MAX) return flow_error_set("all-reduce: %zu elements is too large for MPI", count);
  CHECK("all-reduce", MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mpi_type(dt),
                                    MPI_SUM, mpi(c)));
  return 0;
}

static int m_allgatherv(flow_comm *c, const void *send, size_t count, void *recv, const size_t *counts,
                        const size_t *displs, flow_dtype dt) {
  MPI_Datatype t = mpi_type(dt);
  if (equal_blocks(counts, displs, c->size) && count <= INT_MAX) {
    CHECK("all-gather", MPI_Allgather(send, (int)count, t, recv, (int)count, t, mpi(c)));
    return 0;
  }
  int *ic = malloc(2 * (size_t)c->size * sizeof(int));
  if (!ic) return flow_error_set("all-gather: out of memory");
  int rc = to_ints("all-gather", counts, c->size, ic) || to_ints("all-gather", displs, c->size, ic + c->size);
  if (rc == 0) {
    watch_enter("all-gather");
    int e = MPI_Allgatherv(send, (int)count, t, recv, ic, ic + c->size, t, mpi(c));
    watch_leave();
    if (e != MPI_SUCCESS) rc = mpi_fail("all-gather", e);
  }
  free(ic);
  return rc;
}

static int m_alltoallv(flow_comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                       void *recv, const size_t *rcounts, const size_t *rdispls, flow_dtype dt);

/* acc[i] += x[i] */
#define ADD_INTO(T) do { T *a_ = acc; const T *x_ = x; for (size_t i = 0; i < n; i++) a_[i] += x_[i]; } while (0)
static void add_into(void *acc, const void *x, size_t n, flow_dtype dt) {
  switch (dt) {
  case FLOW_F32: ADD_INTO(float); break;
  case FLOW_F64: ADD_INTO(double); break;
  case FLOW_I64: ADD_INTO(int64_t); break;
  case FLOW_I32: ADD_INTO(int32_t); break;
  default: ADD_INTO(uint8_t); break;
  }
}
#undef ADD_INTO

/* An all-to-all of the blocks, then a local sum of the p blocks this rank receives, in rank order.
 * OpenMPI's MPI_Reduce_scatter(_block) was 20-40x slower than that here (90 ms against 2-4 ms for
 * 16 MB on 2 ranks), because its algorithm for this size reduces the whole buffer first. */
static int m_reduce_scatterv(flow_comm *c, const void *send, void *recv, const size_t *counts, flow_dtype dt) {
  if (sum_check("reduce-scatter", dt)) return -1;
  int n = c->size, me = c->rank;
  size_t es = flow_dtype_size(dt), mine = counts[me];
  size_t *cnt = malloc(4 * (size_t)n * sizeof *cnt);
  const flow_device_impl *host = flow_device_get(FLOW_CPU);
  char *parts = host->alloc(0, (size_t)n * mine * es + 1);
  int rc = 0;
  if (!cnt || !parts) {
    rc = flow_error_set("reduce-scatter: out of memory");
    goto done;
  }
  size_t off = 0;
  for (int q = 0; q < n; off += counts[q], q++) {
    cnt[q] = counts[q];                   /* send: block q to rank q */
    cnt[n + q] = off;
    cnt[2 * n + q] = mine;                /* receive: every rank's block for me, back to back */
    cnt[3 * n + q] = (size_t)q * mine;
  }
  rc = m_alltoallv(c, send, cnt, cnt + n, parts, cnt + 2 * n, cnt + 3 * n, dt);
  if (rc == 0) {
    memcpy(recv, parts, mine * es);
    for (int q = 1; q < n; q++) add_into(recv, parts + (size_t)q * mine * es, mine, dt);
  }
done:
  if (parts) host->free(0, parts, (size_t)n * mine * es + 1);
  free(cnt);
  return rc;
}

static int m_alltoall(flow_comm *c, const void *send, void *recv, size_t count, flow_dtype dt) {
  if (count > INT_MAX) return flow_error_set("all-to-all: %zu elements is too large for MPI", count);
  CHECK("all-to-all", MPI_Alltoall(send, (int)count, mpi_type(dt), recv, (int)count, mpi_type(dt), mpi(c)));
  return 0;
}

static int m_alltoallv(flow_comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                       void *recv, const size_t *rcounts, const size_t *rdispls, flow_dtype dt) {
  MPI_Datatype t = mpi_type(dt);
  int n = c->size, *ic = malloc(4 * (size_t)n * sizeof(int));
  if (!ic) return flow_error_set("all-to-all: out of memory");
  int rc = to_ints("all-to-all", scounts, n, ic) || to_ints("all-to-all", sdispls, n, ic + n) ||
           to_ints("all-to-all", rcounts, n, ic + 2 * n) || to_ints("all-to-all", rdispls, n, ic + 3 * n);
  if (rc == 0) {
    watch_enter("all-to-all");
    int e = MPI_Alltoallv(send, ic, ic + n, t, recv, ic + 2 * n, ic + 3 * n, t, mpi(c));
    watch_leave();
    if (e != MPI_SUCCESS) rc = mpi_fail("all-to-all", e);
  }
  free(ic);
  return rc;
}

/* One MPI vector type per peer and direction; MPI_Alltoallw moves them in one call. */
static int m_alltoall_blocks(flow_comm *c, const void *send, const flow_comm_block *sblocks, void *recv,
                             const flow_comm_block *rblocks, flow_dtype dt) {
  int n = c->size, rc = 0;
  size_t es = flow_dtype_size(dt);
  int *ints = calloc(4 * (size_t)n, sizeof(int));
  MPI_Datatype *types = calloc(2 * (size_t)n, sizeof(MPI_Datatype));
  if (!ints || !types) { free(ints); free(types); return flow_error_set("all-to-all: out of memory"); }
  int made = 0;
  for (int k = 0; k < 2 * n && rc == 0; k++) {
    const flow_comm_block *b = k < n ? &sblocks[k] : &rblocks[k - n];
    if (b->rows > INT_MAX || b->run > INT_MAX || b->stride > INT_MAX || b->offset * es > INT_MAX) {
      rc = flow_error_set("all-to-all: a block is too large for MPI");
      break;
    }
    int e = MPI_Type_vector((int)b->rows, (int)b->run, (int)b->stride, mpi_type(dt), &types[k]);
    if (e == MPI_SUCCESS) e = MPI_Type_commit(&types[k]);
    if (e != MPI_SUCCESS) { rc = mpi_fail("all-to-all", e); break; }
    made = k + 1;
    ints[k] = b->rows && b->run ? 1 : 0;                /* counts: send then recv */
    ints[2 * n + k] = (int)(b->offset * es);            /* byte displacements */
  }
  if (rc == 0) {
    watch_enter("all-to-all");
    int e = MPI_Alltoallw(send, ints, ints + 2 * n, types, recv, ints + n, ints + 3 * n, types + n, mpi(c));
    watch_leave();
    if (e != MPI_SUCCESS) rc = mpi_fail("all-to-all", e);
  }
  for (int k = 0; k < made; k++) MPI_Type_free(&types[k]);
  free(ints);
  free(types);
  return rc;
}

static int m_broadcast(flow_comm *c, void *buf, size_t count, flow_dtype dt, int root) {
  if (count > INT_MAX) return flow_error_set("broadcast: %zu elements is too large for MPI", count);
  CHECK("broadcast", MPI_Bcast(buf, (int)count, mpi_type(dt), root, mpi(c)));
  return 0;
}

static int m_send(flow_comm *c, const void *buf, size_t count, flow_dtype dt, int peer, int tag) {
  if (count > INT_MAX) return flow_error_set("send: %zu elements is too large for MPI", count);
  CHECK("send", MPI_Send(buf, (int)count, mpi_type(dt), peer, tag, mpi(c)));
  return 0;
}

static int m_recv(flow_comm *c, void *buf, size_t count, flow_dtype dt, int peer, int tag) {
  if (count > INT_MAX) return flow_error_set("recv: %zu elements is too large for MPI", count);
  CHECK("recv", MPI_Recv(buf, (int)count, mpi_type(dt), peer, tag, mpi(c), MPI_STATUS_IGNORE));
  return 0;
}

/* Polling with back-off, for waits on peers: spin briefly first, so quick exchanges keep their
 * latency, then yield the core for a millisecond (ranks sharing a core get to run: the peer being
 * waited for may be one), then nap (doubling up to 200 us) to give the core away while nothing
 * arrives: a rank that waits on a peer (a pipeline stage waiting for the previous one's
 * activations) would otherwise spin on a core its own compute thread needs. */
typedef struct backoff {
  struct timespec t0, nap;
  long spins;
} backoff;

static void backoff_start(backoff *b) {
  clock_gettime(CLOCK_MONOTONIC, &b->t0);
  b->nap = (struct timespec){0, 0};
  b->spins = 0;
}

static double seconds_since(const struct timespec *t0) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - t0->tv_sec) + 1e-9 * (double)(now.tv_nsec - t0->tv_nsec);
}

/* One pause between two polls; returns the seconds waited since backoff_start. */
static double backoff_pause(backoff *b) {
  if (b->spins++ < 100) return 0;
  double waited = seconds_since(&b->t0);
  if (waited < 1e-3) {
    sched_yield();
    return waited;
  }
  b->nap.tv_nsec = b->nap.tv_nsec ? (b->nap.tv_nsec * 2 > 200000 ? 200000 : b->nap.tv_nsec * 2) : 5000;
  nanosleep(&b->nap, NULL);
  return seconds_since(&b->t0);
}

/* Receives still pending are cancelled (a late message then stays in MPI's queue, where the next
 * receive with the same tag discards or takes it); sends complete in the background. */
static void drop_requests(int n, MPI_Request *req, bool *arrived) {
  for (int i = 0; i < n; i++) {
    if (req[i] == MPI_REQUEST_NULL) continue;
    MPI_Status st;
    int done = 0, cancelled = 1;
    MPI_Cancel(&req[i]);
    for (int k = 0; k < 1000 && !done; k++)
      if (MPI_Test(&req[i], &done, &st) != MPI_SUCCESS) break;
    if (done) MPI_Test_cancelled(&st, &cancelled);
    else MPI_Request_free(&req[i]); /* a send under way: it completes in the background */
    if (arrived) arrived[i] = !cancelled;
  }
}

/* Wait for the requests, polling; a wait longer than FLOW_TIMEOUT seconds (default 300) is an
 * error naming the transfer. */
static int wait_all(const char *what, int n, MPI_Request *req) {
  double timeout = flow_comm_timeout();
  backoff b;
  backoff_start(&b);
  for (;;) {
    int done = 0, e = MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
    if (e != MPI_SUCCESS) return mpi_fail(what, e);
    if (done) return 0;
    double waited = backoff_pause(&b);
    if (waited > timeout) {
      drop_requests(n, req, NULL);
      return flow_error_set("[rank %d] %s: nothing arrived for %.0f s (FLOW_TIMEOUT): a peer rank stopped or "
                            "skipped this transfer", flow_comm_rank(), what, waited);
    }
  }
}

static int m_exchange(flow_comm *c, const flow_comm_msg *sends, int nsend, const flow_comm_msg *recvs, int nrecv,
                      flow_dtype dt, int tag) {
  MPI_Request *req = malloc((size_t)(nsend + nrecv + 1) * sizeof *req);
  if (!req) return flow_error_set("exchange: out of memory");
  int n = 0, rc = 0;
  for (int i = 0; i < nrecv && rc == 0; i++) {
    if (recvs[i].count > INT_MAX) { rc = flow_error_set("exchange: a message is too large for MPI"); break; }
    int e = MPI_Irecv(recvs[i].buf, (int)recvs[i].count, mpi_type(dt), recvs[i].peer, tag, mpi(c), &req[n]);
    if (e != MPI_SUCCESS) rc = mpi_fail("recv", e);
    else n++;
  }
  for (int i = 0; i < nsend && rc == 0; i++) {
    if (sends[i].count > INT_MAX) { rc = flow_error_set("exchange: a message is too large for MPI"); break; }
    int e = MPI_Isend(sends[i].buf, (int)sends[i].count, mpi_type(dt), sends[i].peer, tag, mpi(c), &req[n]);
    if (e != MPI_SUCCESS) rc = mpi_fail("send", e);
    else n++;
  }
  int e = rc == 0 ? wait_all("exchange", n, req) : (MPI_Waitall(n, req, MPI_STATUSES_IGNORE), -1);
  if (rc == 0) rc = e;
  free(req);
  return rc;
}

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
enum { HS_OK, HS_FAILED, HS_CANCELLED };

struct record {
  unsigned long long seq;
  long long lo, hi;
  int status, rank; /* a verdict's HS_FAILED: the rank that failed */
  char what[64];
  char msg[768];    /* a failure's or a cancel's message; only its used part is sent */
};

static void fill(record *r, long long v, int status, int rank, const char *what, const char *msg) {
  r->lo = r->hi = v;
  r->status = status;
  r->rank = rank;
  snprintf(r->what, sizeof r->what, "%s", what);
  snprintf(r->msg, sizeof r->msg, "%s", msg);
}

/* Wait for this rank's previous sends to be out, then send r as this handshake's message to `to`
 * (-1: every peer). */
static int send_record(flow_comm *c, int tag, int to, const record *r) {
  mpi_impl *im = impl_of(c);
  int n = c->size, done = 0;
  for (int k = 0; k < 100000 && !done; k++) MPI_Testall(n, im->sends, &done, MPI_STATUSES_IGNORE);
  if (!done) { /* a send still under way (a stopped peer): let it finish with its own buffer */
    for (int q = 0; q < n; q++)
      if (im->sends[q] != MPI_REQUEST_NULL) MPI_Request_free(&im->sends[q]);
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
    if (e != MPI_SUCCESS) return mpi_fail("handshake", e);
  }
  return 0;
}

/* Receive into the records of the ranks whose req is active until each holds this handshake's
 * number (older ones are dropped and received again), or the time runs out: 1 then, with the
 * requests still active. */
static int await(flow_comm *c, int tag, int n, record *got, MPI_Request *req, double timeout, double *waited) {
  mpi_impl *im = impl_of(c);
  int left = 0, idx[n];
  for (int q = 0; q < n; q++) left += req[q] != MPI_REQUEST_NULL;
  backoff b;
  backoff_start(&b);
  *waited = 0;
  while (left > 0) {
    int k = 0, e = MPI_Testsome(n, req, &k, idx, MPI_STATUSES_IGNORE);
    if (e != MPI_SUCCESS) return mpi_fail("handshake", e);
    for (int i = 0; i < (k == MPI_UNDEFINED ? 0 : k); i++) {
      int q = idx[i];
      if (got[q].seq < im->seq) e = MPI_Irecv(&got[q], (int)sizeof got[q], MPI_BYTE, q, tag, im->ctl, &req[q]);
      else if (got[q].seq > im->seq)
        return flow_error_set("[rank %d] handshake: rank %d is at handshake %llu but this rank at %llu: the ranks are "
                              "out of step", c->rank, q, got[q].seq, im->seq);
      else left--;
      if (e != MPI_SUCCESS) return mpi_fail("handshake", e);
    }
    if (left > 0 && (*waited = backoff_pause(&b)) > timeout) return 1;
  }
  return 0;
}

/* A member that gave up on this handshake (the leader was late): its withdraw message, if one came.
 * Open MPI's probe matches before it progresses, so probe a few times. */
static bool withdrawn(flow_comm *c, int *who) {
  mpi_impl *im = impl_of(c);
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
  mpi_impl *im = impl_of(c);
  int n = c->size, rc = 0;
  record *got = malloc((size_t)n * sizeof *got);
  MPI_Request *req = malloc((size_t)n * sizeof *req);
  if (!got || !req) { free(got); free(req); return flow_error_set("handshake: out of memory"); }
  for (int q = 0; q < n && rc == 0; q++) {
    req[q] = MPI_REQUEST_NULL;
    got[q].seq = 0;
    if (q == c->rank) continue;
    int e = MPI_Irecv(&got[q], (int)sizeof got[q], MPI_BYTE, q, TAG_RECORD, im->ctl, &req[q]);
    if (e != MPI_SUCCESS) rc = mpi_fail("handshake", e);
  }
  double waited = 0;
  int late = rc == 0 ? await(c, TAG_RECORD, n, got, req, flow_comm_timeout(), &waited) : -1;
  fill(v, mine, HS_OK, c->rank, what, "");
  int who;
  if (late < 0) {
    drop_requests(n, req, NULL);
    rc = -1;
  } else if (late) { /* name the ranks whose record did not come, and where the others are */
    bool *arrived = calloc((size_t)n, sizeof *arrived);
    drop_requests(n, req, arrived);
    size_t len = (size_t)snprintf(v->msg, sizeof v->msg, "waited %.0f s (FLOW_TIMEOUT) for rank", waited);
    for (int q = 0, first = 1; q < n && len < sizeof v->msg; q++)
      if (q != c->rank && got[q].seq != im->seq && !(arrived && arrived[q])) {
        len += (size_t)snprintf(v->msg + len, sizeof v->msg - len, "%s %d", first ? "" : ",", q);
        first = 0;
      }
    if (len < sizeof v->msg)
      len += (size_t)snprintf(v->msg + len, sizeof v->msg - len, ", which did not arrive (stopped, stuck, failed "
                              "outside a global op or took another path); rank %d is at %s", c->rank, what);
    for (int q = 0; q < n && len < sizeof v->msg; q++)
      if (q != c->rank && got[q].seq == im->seq)
        len += (size_t)snprintf(v->msg + len, sizeof v->msg - len, ", rank %d at %s", q, got[q].what);
    free(arrived);
    v->status = HS_CANCELLED;
  } else if (withdrawn(c, &who)) {
    snprintf(v->msg, sizeof v->msg, "rank %d gave up waiting for this rank, the handshake's leader (FLOW_TIMEOUT)", who);
    v->status = HS_CANCELLED;
  } else {
    for (int q = 0; q < n; q++) {
      if (q == c->rank) continue;
      if (got[q].status == HS_FAILED && v->status == HS_OK) {
        v->status = HS_FAILED;
        v->rank = q;
        snprintf(v->msg, sizeof v->msg, "%s", got[q].msg);
      }
      if (got[q].lo < v->lo) v->lo = got[q].lo;
      if (got[q].hi > v->hi) v->hi = got[q].hi;
    }
  }
  if (rc == 0) rc = send_record(c, TAG_VERDICT, -1, v);
  free(got);
  free(req);
  return rc;
}

/* A member: send the record to the leader (rank 0), wait for its verdict v. */
static int follow(flow_comm *c, const char *what, long long mine, record *v) {
  mpi_impl *im = impl_of(c);
  fill(v, mine, HS_OK, c->rank, what, "");
  int rc = send_record(c, TAG_RECORD, 0, v);
  if (rc != 0) return rc;
  MPI_Request req;
  v->seq = 0;
  int e = MPI_Irecv(v, (int)sizeof *v, MPI_BYTE, 0, TAG_VERDICT, im->ctl, &req);
  if (e != MPI_SUCCESS) return mpi_fail("handshake", e);
  double waited;
  int late = await(c, TAG_VERDICT, 1, v, &req, flow_comm_timeout() + 2, &waited); /* the leader gives up first */
  if (late == 0) return 0;
  drop_requests(1, &req, NULL);
  if (late < 0) return -1;
  MPI_Send(&im->seq, 1, MPI_UNSIGNED_LONG_LONG, 0, TAG_WITHDRAW, im->ctl);
  return flow_error_set("[rank %d] %s: waited %.0f s (FLOW_TIMEOUT + 2 s) for rank 0, which leads this handshake and "
                        "did not answer (stopped, stuck, failed outside a global op or took another path)",
                        c->rank, what, waited);
}

static int m_handshake(flow_comm *c, const char *what, long long v, long long *min, long long *max) {
  *min = *max = v;
  if (c->size < 2) return 0;
  impl_of(c)->seq++;
  record r;
  int rc = c->rank == 0 ? lead(c, what, v, &r) : follow(c, what, v, &r);
  if (rc != 0) return rc;
  if (r.status == HS_FAILED) {
    const char *m = r.msg, *tail = strncmp(m, "[rank ", 6) == 0 ? strstr(m, "] ") : NULL;
    return flow_error_set("[rank %d] %s: rank %d failed: %s", c->rank, what, r.rank, tail ? tail + 2 : m);
  }
  if (r.status == HS_CANCELLED)
    return flow_error_set(c->rank == 0 ? "[rank %d] %s: %s" : "[rank %d] %s: rank 0 gave up waiting, so no rank moves "
                          "data here: %s", c->rank, what, r.msg);
  *min = r.lo;
  *max = r.hi;
  return 0;
}

static void m_fail(flow_comm *c, const char *what, const char *msg) {
  if (c->size < 2) return;
  impl_of(c)->seq++;
  char keep[1024];
  snprintf(keep, sizeof keep, "%s", flow_error_get());
  record r;
  fill(&r, 0, HS_FAILED, c->rank, what, msg);
  send_record(c, c->rank == 0 ? TAG_VERDICT : TAG_RECORD, c->rank == 0 ? -1 : 0, &r);
  flow_error_set("%s", keep);
}

static int m_minmax(flow_comm *c, long long v, long long *min, long long *max) {
  return m_handshake(c, "agreement check", v, min, max);
}

/* A handshake whose value says "barrier": a rank that meets another's global op here is out of step. */
static int m_barrier(flow_comm *c) {
  long long lo, hi;
  if (m_handshake(c, "barrier", -2, &lo, &hi) != 0) return -1;
  if (lo != hi)
    return flow_error_set("[rank %d] barrier: another rank is at a global op's handshake here, not at this barrier "
                          "(the ranks took different paths)", c->rank);
  return 0;
}

static const flow_comm_ops mpi_ops;

/* Collective over m (it duplicates m for the handshakes). */
static flow_comm *wrap(MPI_Comm m) {
  flow_comm *c = calloc(1, sizeof *c);
  mpi_impl *h = calloc(1, sizeof *h);
  if (h) h->out = malloc(sizeof *h->out);
  int size = 0;
  MPI_Comm_size(m, &size);
  if (h) h->sends = malloc((size_t)size * sizeof *h->sends);
  if (!c || !h || !h->out || !h->sends) {
    if (h) { free(h->out); free(h->sends); }
    free(c); free(h);
    flow_error_set("communicator: out of memory");
    return NULL;
  }
  for (int q = 0; q < size; q++) h->sends[q] = MPI_REQUEST_NULL;
  h->comm = m;
  lsan_off();
  int e = MPI_Comm_dup(m, &h->ctl);
  lsan_on();
  if (e != MPI_SUCCESS) {
    free(h->out); free(h->sends); free(h); free(c);
    mpi_fail("communicator", e);
    return NULL;
  }
  MPI_Comm_set_errhandler(h->ctl, MPI_ERRORS_RETURN);
  c->ops = &mpi_ops;
  c->impl = h;
  c->rank = 0;
  MPI_Comm_rank(m, &c->rank);
  c->size = size;
  return c;
}

static int m_group(flow_comm *c, const int *members, int n, flow_comm **out) {
  MPI_Group all, sub;
  MPI_Comm m;
  CHECK("communicator group", MPI_Comm_group(mpi(c), &all));
  int rc = MPI_Group_incl(all, n, members, &sub);
  MPI_Group_free(&all);
  if (rc != MPI_SUCCESS) return mpi_fail("communicator group", rc);
  lsan_off();
  rc = MPI_Comm_create_group(mpi(c), sub, 7, &m);
  lsan_on();
  MPI_Group_free(&sub);
  if (rc != MPI_SUCCESS) return mpi_fail("communicator group", rc);
  MPI_Comm_set_errhandler(m, MPI_ERRORS_RETURN);
  *out = wrap(m);
  return *out ? 0 : -1;
}

static void m_free(flow_comm *c) {
  mpi_impl *h = impl_of(c);
  int fin = 0, done = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Testall(c->size, h->sends, &done, MPI_STATUSES_IGNORE);
  if (!fin && !done)
    for (int q = 0; q < c->size; q++)
      if (h->sends[q] != MPI_REQUEST_NULL) MPI_Request_free(&h->sends[q]);
  if (!fin) MPI_Comm_free(&h->ctl);
  if (!fin && h->comm != MPI_COMM_WORLD) MPI_Comm_free(&h->comm);
  if (fin || done) free(h->out); /* else MPI may still read it */
  free(h->sends);
  free(h);
  free(c);
}

static const flow_comm_ops mpi_ops = {
    .allreduce = m_allreduce, .allgatherv = m_allgatherv, .reduce_scatterv = m_reduce_scatterv,
    .alltoall = m_alltoall, .alltoallv = m_alltoallv, .alltoall_blocks = m_alltoall_blocks,
    .broadcast = m_broadcast, .send = m_send, .recv = m_recv, .exchange = m_exchange, .barrier = m_barrier,
    .handshake = m_handshake, .fail = m_fail, .minmax = m_minmax,
    .group = m_group, .free = m_free};

/* ---- bootstrap -------------------------------------------------------------------------------- */

/* MPI's singleton start costs about a second (it starts a runtime daemon), so a plain run is a
 * world of one on comm_self.c. MPI starts when a launcher made a world to join (the variables
 * mpirun, srun and the PMI/PMIx launchers give each process), when FLOW_MPI=1 asks for it, or when
 * MPI is already running (a host program started it). FLOW_MPI=0 keeps it off even then. srun
 * sets SLURM_STEP_NUM_TASKS only for a job step, not in the batch script. */
static bool launched(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK",
                                     "MPI_LOCALNRANKS", "SLURM_STEP_NUM_TASKS", NULL};
  for (int i = 0; vars[i]; i++)
    if (getenv(vars[i])) return true;
  return false;
}

static bool want_mpi(void) {
  const char *env = getenv("FLOW_MPI");
  if (env && *env) return strcmp(env, "0") != 0;
  int inited = 0;
  MPI_Initialized(&inited);
  return inited || launched();
}

/* Finalise MPI when the process exits without closing the Lua state (os.exit(0) under mpirun):
 * mpirun reports a rank that exits without MPI_Finalize as a failure. */
static void finalize_at_exit(void) { flow_comm_finalize(); }

int flow_comm_init_mpi(void) {
  if (world && world->ops == &mpi_ops) return 0;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided, fin = 0;
    MPI_Finalized(&fin);
    if (fin) return flow_error_set("flow_comm_init_mpi: MPI was finalized and cannot start again");
    lsan_off();
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    lsan_on();
    if (rc != MPI_SUCCESS) return flow_error_set("flow_comm_init_mpi: MPI_Init_thread failed");
    if (!we_started) atexit(finalize_at_exit);
    we_started = true;
  }
  /* The world of one used before MPI started may be held by placements: it stays valid (a group
   * of rank 0 alone) and is freed with the cached groups. */
  if (world) {
    cached *c = calloc(1, sizeof *c);
    if (!c) return flow_error_set("flow_comm_init_mpi: out of memory");
    c->comm = world;
    c->next = cache;
    cache = c;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  world = wrap(MPI_COMM_WORLD);
  return world ? 0 : -1;
}

int flow_comm_init(void) {
  if (world) return 0;
  if (want_mpi()) return flow_comm_init_mpi();
  world = flow_comm_self_new();
  return world ? 0 : -1;
}

bool flow_comm_uses_mpi(void) { return world && world->ops == &mpi_ops; }

void flow_comm_finalize(void) {
  free_cached();
  if (world) world->ops->free(world);
  world = NULL;
  int fin = 0;
  MPI_Finalized(&fin);
  if (we_started && !fin) {
    lsan_check_now();
    lsan_off();
    MPI_Finalize();
    lsan_on();
  }
}

void flow_comm_abort(int code) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!flow_comm_uses_mpi() || world->size < 2 || fin) return;
  fflush(stdout);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
}

int flow_comm_node_local(int *rank, int *size) {
  *rank = 0;
  *size = 1;
  if (!world && flow_comm_init() != 0) return -1;
  if (!flow_comm_uses_mpi()) return 0;
  MPI_Comm node;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
    return flow_error_set("MPI_Comm_split_type failed");
  MPI_Comm_rank(node, rank);
  MPI_Comm_size(node, size);
  MPI_Comm_free(&node);
  return 0;
}

#else /* no MPI: a world of one */

int flow_comm_init(void) {
  if (!world) world = flow_comm_self_new();
  return world ? 0 : -1;
}

int flow_comm_init_mpi(void) { return flow_error_set("flow_comm_init_mpi: this build has no MPI (FLOW_MPI=OFF)"); }

bool flow_comm_uses_mpi(void) { return false; }

void flow_comm_abort(int code) { (void)code; }

void flow_comm_finalize(void) {
  free_cached();
  if (world) world->ops->free(world);
  world = NULL;
}

int flow_comm_node_local(int *rank, int *size) {
  *rank = 0;
  *size = 1;
  return 0;
}

#endif

int flow_comm_rank(void) { return world ? world->rank : 0; }
int flow_comm_size(void) { return world ? world->size : 1; }
flow_comm *flow_comm_world(void) { return world; }

flow_comm *flow_comm_for_ranks(const int *ranks, int n) {
  if (!world && flow_comm_init() != 0) return NULL;
  bool all = n == world->size; /* every rank in world order: the world itself, not a copy of it */
  for (int i = 0; i < n && all; i++) all = ranks[i] == i;
  if (all) return world;
  for (cached *c = cache; c; c = c->next)
    if (c->n == n && memcmp(c->ranks, ranks, (size_t)n * sizeof(int)) == 0) return c->comm;
  bool member = false;
  for (int i = 0; i < n; i++) member |= ranks[i] == world->rank;
  if (!member) {
    flow_error_set("[rank %d] communicator: this rank is not one of the group's ranks", world->rank);
    return NULL;
  }
  cached *c = calloc(1, sizeof *c);
  if (c) c->ranks = malloc((size_t)n * sizeof(int));
  if (!c || !c->ranks) { if (c) free(c); flow_error_set("communicator: out of memory"); return NULL; }
  memcpy(c->ranks, ranks, (size_t)n * sizeof(int));
  c->n = n;
  if (world->ops->group(world, ranks, n, &c->comm) != 0) { free(c->ranks); free(c); return NULL; }
  c->next = cache;
  cache = c;
  return c->comm;
}
