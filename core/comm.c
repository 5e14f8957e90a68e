/* Rank bootstrap with MPI and the MPI backend of the communicator interface (comm.h). A build
 * without MPI (FLOW_MPI=OFF) is a world of one on comm_self.c's backend. */
#include "comm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm_local.h"
#include "comm_backend.h"
#include "hash.h"
#include "device.h"
#include "error.h"

static flow_comm *world;
/* every rank's process id and node (flow_comm_procs), once gathered; world's size and this rank */
static flow_comm_proc *procs;
static int nprocs, my_rank;

/* Communicators made for rank lists, kept for the life of the process (a handful exist). */
typedef struct cached {
  int n, channel;
  int *ranks;
  flow_comm *comm;
  struct cached *next;
} cached;
static cached *cache;
/* Threads of one process may look up communicators at once (channels); each creates its own
 * channel's, so the lock covers the list only, never a (collective) creation. */
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int channel;

int flow_comm_set_channel(int c) {
  int prev = channel;
  channel = c;
  return prev;
}

int flow_comm_channel(void) { return channel; }

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

/* Seconds from the environment variable name when positive, else dflt. */
static double env_seconds(const char *name, double dflt) {
  const char *e = getenv(name);
  return e && atof(e) > 0 ? atof(e) : dflt;
}

double flow_comm_timeout(void) {
  if (timeout_s <= 0) timeout_s = env_seconds("FLOW_TIMEOUT", 300);
  return timeout_s;
}

double flow_comm_grace(void) {
  static double grace_s = -1;
  if (grace_s < 0) grace_s = env_seconds("FLOW_WATCHDOG_GRACE", 10);
  return grace_s;
}

#ifdef FLOW_HAVE_MPI
#include <mpi.h>

#include "comm_mpi.h"

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

static MPI_Comm mpi(flow_comm *c) { return flow_comm_mpi_of(c)->comm; }

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

int flow_comm_mpi_fail(const char *what, int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return flow_error_set("[rank %d] %s failed: %s", flow_comm_rank(), what, msg);
}

/* A blocking MPI call, watched; its failure is an error naming `what`. */
#define CHECK(what, call) do { flow_comm_watch_enter(what); int rc_ = (call); flow_comm_watch_leave(); \
                               if (rc_ != MPI_SUCCESS) return flow_comm_mpi_fail(what, rc_); } while (0)

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

static int m_reduce_scatterv(flow_comm *c, const void *send, void *recv, const size_t *counts, flow_dtype dt);
static int m_allgatherv(flow_comm *c, const void *send, size_t count, void *recv, const size_t *counts,
                        const size_t *displs, flow_dtype dt);

/* float16 and bfloat16 have no MPI_SUM: our own sum, through a reduce-scatter and an all-gather */
static int m_allreduce(flow_comm *c, const void *send, void *recv, size_t count, flow_dtype dt) {
  if (flow_comm_sum_check("all-reduce", dt)) return -1;
  if (flow_dtype_is_half(dt))
    return flow_comm_allreduce_by_parts(c, send, recv, count, dt, m_reduce_scatterv, m_allgatherv);
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
    flow_comm_watch_enter("all-gather");
    int e = MPI_Allgatherv(send, (int)count, t, recv, ic, ic + c->size, t, mpi(c));
    flow_comm_watch_leave();
    if (e != MPI_SUCCESS) rc = flow_comm_mpi_fail("all-gather", e);
  }
  free(ic);
  return rc;
}

static int m_alltoallv(flow_comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                       void *recv, const size_t *rcounts, const size_t *rdispls, flow_dtype dt);

/* An all-to-all of the blocks, then a local sum of the p blocks this rank receives, in rank order.
 * OpenMPI's MPI_Reduce_scatter(_block) was 20-40x slower than that here (90 ms against 2-4 ms for
 * 16 MB on 2 ranks), because its algorithm for this size reduces the whole buffer first. */
static int m_reduce_scatterv(flow_comm *c, const void *send, void *recv, const size_t *counts, flow_dtype dt) {
  if (flow_comm_sum_check("reduce-scatter", dt)) return -1;
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
    for (int q = 1; q < n; q++) flow_comm_add_into(recv, parts + (size_t)q * mine * es, mine, dt);
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
    flow_comm_watch_enter("all-to-all");
    int e = MPI_Alltoallv(send, ic, ic + n, t, recv, ic + 2 * n, ic + 3 * n, t, mpi(c));
    flow_comm_watch_leave();
    if (e != MPI_SUCCESS) rc = flow_comm_mpi_fail("all-to-all", e);
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
    if (e != MPI_SUCCESS) { rc = flow_comm_mpi_fail("all-to-all", e); break; }
    made = k + 1;
    ints[k] = b->rows && b->run ? 1 : 0;                /* counts: send then recv */
    ints[2 * n + k] = (int)(b->offset * es);            /* byte displacements */
  }
  if (rc == 0) {
    flow_comm_watch_enter("all-to-all");
    int e = MPI_Alltoallw(send, ints, ints + 2 * n, types, recv, ints + n, ints + 3 * n, types + n, mpi(c));
    flow_comm_watch_leave();
    if (e != MPI_SUCCESS) rc = flow_comm_mpi_fail("all-to-all", e);
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


/* Receives still pending are cancelled (a late message then stays in MPI's queue, where the next
 * receive with the same tag discards or takes it); sends complete in the background. */
void flow_comm_drop_requests(int n, MPI_Request *req, bool *arrived) {
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
  flow_comm_backoff b;
  flow_comm_backoff_start(&b);
  for (;;) {
    int done = 0, e = MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
    if (e != MPI_SUCCESS) return flow_comm_mpi_fail(what, e);
    if (done) return 0;
    double waited = flow_comm_backoff_pause(&b);
    if (waited > timeout) {
      flow_comm_drop_requests(n, req, NULL);
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
    if (e != MPI_SUCCESS) rc = flow_comm_mpi_fail("recv", e);
    else n++;
  }
  for (int i = 0; i < nsend && rc == 0; i++) {
    if (sends[i].count > INT_MAX) { rc = flow_error_set("exchange: a message is too large for MPI"); break; }
    int e = MPI_Isend(sends[i].buf, (int)sends[i].count, mpi_type(dt), sends[i].peer, tag, mpi(c), &req[n]);
    if (e != MPI_SUCCESS) rc = flow_comm_mpi_fail("send", e);
    else n++;
  }
  int e = rc == 0 ? wait_all("exchange", n, req) : (MPI_Waitall(n, req, MPI_STATUSES_IGNORE), -1);
  if (rc == 0) rc = e;
  free(req);
  return rc;
}

static const flow_comm_ops mpi_ops;

/* Collective over m (it duplicates m for the handshakes). */
static flow_comm *wrap(MPI_Comm m) {
  flow_comm *c = calloc(1, sizeof *c);
  flow_comm_mpi *h = calloc(1, sizeof *h);
  if (h) h->out = flow_comm_record_new();
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
    flow_comm_mpi_fail("communicator", e);
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
  if (rc != MPI_SUCCESS) return flow_comm_mpi_fail("communicator group", rc);
  lsan_off();
  rc = MPI_Comm_create_group(mpi(c), sub, 7 + channel, &m); /* channels create at once */
  lsan_on();
  MPI_Group_free(&sub);
  if (rc != MPI_SUCCESS) return flow_comm_mpi_fail("communicator group", rc);
  MPI_Comm_set_errhandler(m, MPI_ERRORS_RETURN);
  *out = wrap(m);
  return *out ? 0 : -1;
}

/* Send buffers whose sends were still in flight when they were let go (a handshake's record that
 * a stopped peer had not taken, at the next handshake or when the communicator is freed): MPI may
 * still read them until MPI_Finalize, which frees them after. Held here they stay reachable, so
 * the leak check before MPI_Finalize does not report them (it did, now and then, when a rank of
 * the REPL spec had failed lines). */
static void **unsent;
static int nunsent;
static pthread_mutex_t unsent_lock = PTHREAD_MUTEX_INITIALIZER;

/* Keeps buf until free_unsent; false (and buf kept nowhere) when out of memory. */
bool flow_comm_keep_unsent(void *buf) {
  pthread_mutex_lock(&unsent_lock);
  void **more = realloc(unsent, (size_t)(nunsent + 1) * sizeof *unsent);
  if (more) {
    unsent = more;
    unsent[nunsent++] = buf;
  }
  pthread_mutex_unlock(&unsent_lock);
  return more != NULL;
}

static void free_unsent(void) {
  pthread_mutex_lock(&unsent_lock);
  for (int i = 0; i < nunsent; i++) free(unsent[i]);
  free(unsent);
  unsent = NULL;
  nunsent = 0;
  pthread_mutex_unlock(&unsent_lock);
}

static void m_free(flow_comm *c) {
  flow_comm_mpi *h = flow_comm_mpi_of(c);
  int fin = 0, done = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Testall(c->size, h->sends, &done, MPI_STATUSES_IGNORE);
  if (!fin && !done)
    for (int q = 0; q < c->size; q++)
      if (h->sends[q] != MPI_REQUEST_NULL) MPI_Request_free(&h->sends[q]);
  if (!fin) MPI_Comm_free(&h->ctl);
  if (!fin && h->comm != MPI_COMM_WORLD) MPI_Comm_free(&h->comm);
  if (fin || done) free(h->out);
  else flow_comm_keep_unsent(h->out); /* MPI may still read it */
  free(h->sends);
  free(h);
  free(c);
}

static int m_poll(flow_comm *c, void *buf, size_t cap, int tag, int peer) {
  int flag = 0, count = 0;
  MPI_Status st;
  if (MPI_Iprobe(peer < 0 ? MPI_ANY_SOURCE : peer, tag, mpi(c), &flag, &st) != MPI_SUCCESS || !flag) return -1;
  MPI_Get_count(&st, MPI_BYTE, &count);
  if (count < 0 || (size_t)count > cap) return -1; /* not one of ours: leave it */
  if (MPI_Recv(buf, count, MPI_BYTE, st.MPI_SOURCE, tag, mpi(c), MPI_STATUS_IGNORE) != MPI_SUCCESS) return -1;
  return st.MPI_SOURCE;
}

static unsigned long long m_seq(flow_comm *c, const unsigned long long *set) {
  if (set) flow_comm_mpi_of(c)->seq = *set;
  return flow_comm_mpi_of(c)->seq;
}

static const flow_comm_ops mpi_ops = {
    .allreduce = m_allreduce, .allgatherv = m_allgatherv, .reduce_scatterv = m_reduce_scatterv,
    .alltoall = m_alltoall, .alltoallv = m_alltoallv, .alltoall_blocks = m_alltoall_blocks,
    .broadcast = m_broadcast, .send = m_send, .recv = m_recv, .exchange = m_exchange,
    .barrier = flow_comm_handshake_barrier, .handshake = flow_comm_handshake_mpi, .fail = flow_comm_fail_mpi,
    .minmax = flow_comm_handshake_minmax,
    .group = m_group, .free = m_free, .poll = m_poll, .seq = m_seq};

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

/* ---- a rank that is gone -------------------------------------------------------------------------
 * When a rank dies (SIGKILL, a crash), mpirun ends the others with SIGTERM (then SIGKILL). Before
 * it does, each rank knows the process id and node of every rank (gathered at start), so the
 * lowest living rank of a node names the ranks of its node that are gone, in our own words, then
 * lets SIGTERM end it. Only async-signal-safe calls here: kill, open, read, write. */

static bool proc_gone(long pid) {
  if (kill((pid_t)pid, 0) != 0) return errno == ESRCH;
  char path[40] = "/proc/", stat[160];
  int len = 6;
  char digits[24];
  int nd = 0;
  for (long v = pid; v > 0 && nd < 20; v /= 10) digits[nd++] = (char)('0' + v % 10);
  while (nd > 0) path[len++] = digits[--nd];
  memcpy(path + len, "/stat", 6);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return true;
  ssize_t n = read(fd, stat, sizeof stat - 1);
  close(fd);
  if (n <= 0) return true;
  stat[n] = 0;
  const char *p = strrchr(stat, ')'); /* "pid (name) S ...": a zombie (Z) is gone */
  return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static void put_num(char *buf, int *len, long v) {
  char d[24];
  int n = 0;
  do { d[n++] = (char)('0' + v % 10); v /= 10; } while (v > 0 && n < 20);
  while (n > 0) buf[(*len)++] = d[--n];
}

static void put_str(char *buf, int *len, const char *s) {
  while (*s && *len < 400) buf[(*len)++] = *s++;
}

static volatile sig_atomic_t said_who_is_gone;

static void say_who_is_gone(void) {
  if (said_who_is_gone) return;
  int gone = 0, lowest = -1, len = 0;
  char msg[512];
  for (int q = 0; q < nprocs; q++) {
    if (procs[q].host != procs[my_rank].host) continue;
    if (q != my_rank && proc_gone(procs[q].pid)) {
      put_str(msg, &len, gone++ ? ", rank " : " rank ");
      put_num(msg, &len, q);
      put_str(msg, &len, " (pid ");
      put_num(msg, &len, procs[q].pid);
      put_str(msg, &len, ")");
    } else if (lowest < 0) {
      lowest = q;
    }
  }
  if (gone && lowest == my_rank) {
    char out[600];
    int n = 0;
    put_str(out, &n, "flowlua: [rank ");
    put_num(out, &n, my_rank);
    put_str(out, &n, "]");
    memcpy(out + n, msg, (size_t)len);
    n += len;
    put_str(out, &n, gone > 1 ? " are gone" : " is gone");
    put_str(out, &n, " (exited, killed or crashed), so the job ends\n");
    ssize_t w = write(2, out, (size_t)n);
    (void)w;
    said_who_is_gone = 1;
  }
}

static void on_sigterm(int sig) {
  say_who_is_gone();
  signal(sig, SIG_DFL);
  raise(sig);
}

static void name_the_gone(void) {
  struct sigaction old;
  if (world->size < 2 || sigaction(SIGTERM, NULL, &old) != 0 || old.sa_handler != SIG_DFL) return;
  if (!flow_comm_procs()) return; /* the handler reads procs */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
}

int flow_comm_init_mpi(void) {
  if (world && world->ops == &mpi_ops) return 0;
  if (flow_comm_local_joined())
    return flow_error_set("flow_comm_init_mpi: this process is a rank of flowlua --ranks, whose world is not MPI's");
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
  if (world) name_the_gone();
  return world ? 0 : -1;
}

int flow_comm_init(void) {
  if (world) return 0;
  if ((world = flow_comm_local_world())) return 0;
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
    free_unsent();
  }
}

void flow_comm_abort(int code) {
  flow_comm_local_abort(code);
  int fin = 0;
  MPI_Finalized(&fin);
  if (!flow_comm_uses_mpi() || world->size < 2 || fin) return;
  fflush(stdout);
  fflush(stderr);
  if (procs) say_who_is_gone(); /* a rank's death may be why this one gives up */
  MPI_Abort(MPI_COMM_WORLD, code);
}

int flow_comm_node_local(int *rank, int *size) {
  *rank = 0;
  *size = 1;
  if (!world && flow_comm_init() != 0) return -1;
  if (!flow_comm_uses_mpi()) { /* one rank, or ranks launched by --ranks: all on this node */
    *rank = world->rank;
    *size = world->size;
    return 0;
  }
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
  if (!world && !(world = flow_comm_local_world())) world = flow_comm_self_new();
  return world ? 0 : -1;
}

int flow_comm_init_mpi(void) { return flow_error_set("flow_comm_init_mpi: this build has no MPI (FLOW_MPI=OFF)"); }

bool flow_comm_uses_mpi(void) { return false; }

void flow_comm_abort(int code) { flow_comm_local_abort(code); }

void flow_comm_finalize(void) {
  free_cached();
  if (world) world->ops->free(world);
  world = NULL;
}

int flow_comm_node_local(int *rank, int *size) { /* one rank, or ranks launched by --ranks */
  if (flow_comm_init() != 0) return -1;
  *rank = world->rank;
  *size = world->size;
  return 0;
}

#endif

int flow_comm_rank(void) { return world ? world->rank : 0; }
int flow_comm_size(void) { return world ? world->size : 1; }
flow_comm *flow_comm_world(void) { return world; }

const flow_comm_proc *flow_comm_procs(void) {
  if (procs || !world) return procs;
  flow_comm_proc me = {0, (long)getpid()};
  char host[256] = "", *all;
  size_t *lens;
  gethostname(host, sizeof host - 1);
  me.host = (long)flow_fnv(FLOW_FNV_START, host, strlen(host));
  if (flow_comm_allgather_bytes(world, &me, sizeof me, &all, &lens) != 0) return NULL;
  free(lens);
  nprocs = world->size;
  my_rank = world->rank;
  return procs = (flow_comm_proc *)all; /* malloc'd: aligned; kept for the life of the process */
}

/* "[0, 1, 2]" (the first 16 ranks, then "...") into buf */
static const char *rank_list(char *buf, size_t size, const int64_t *ranks, int64_t n) {
  size_t len = (size_t)snprintf(buf, size, "[");
  for (int64_t i = 0; i < n && i < 16 && len < size; i++)
    len += (size_t)snprintf(buf + len, size - len, i ? ", %lld" : "%lld", (long long)ranks[i]);
  if (len < size) snprintf(buf + len, size - len, n > 16 ? ", ...] (%lld ranks)" : "]", (long long)n);
  return buf;
}

/* Before the members make a communicator (a collective over them that would wait forever when one
 * of them names another group: the same placement listed in another order, or another placement),
 * they agree on the group, point to point over the world, each within FLOW_TIMEOUT: each member
 * sends the group as it sees it to the lowest rank of that group, which answers every member with
 * its verdict. A member that names another group fails at once, on both sides; one that never
 * comes makes the lowest rank fail after FLOW_TIMEOUT and the others 2 s later. */
enum { GROUP_LIST = 16 };
typedef struct group_record {
  int64_t n, hash, ranks[GROUP_LIST];
} group_record;

/* Receive each of the n messages msgs[i] (peer, buf, count bytes) with `tag` by polling, until all
 * came (0), the time ran out (1) or a notice of the REPL's failed line came (-1 with its error). */
static int poll_each(const flow_comm_msg *msgs, int n, int tag, double timeout, const char *what) {
  bool *got = calloc((size_t)n + 1, sizeof *got);
  if (!got) return flow_error_set("communicator: out of memory");
  int left = n, rc = 0;
  flow_comm_backoff b;
  flow_comm_backoff_start(&b);
  while (left > 0 && rc == 0) {
    for (int i = 0; i < n; i++)
      if (!got[i] && world->ops->poll(world, msgs[i].buf, msgs[i].count, tag, msgs[i].peer) >= 0) { got[i] = true; left--; }
    if (left == 0) break;
    double waited = flow_comm_backoff_pause(&b);
    if (waited > timeout || flow_comm_interrupted()) rc = 1;
    else if (waited > 1e-3 && flow_comm_noticed(NULL, what) != 0) rc = -1;
  }
  free(got);
  return rc;
}

static int agree_on_group(const int *ranks, int n) {
  if (world->size < 2 || n < 2 || !world->ops->poll) return 0;
  group_record mine = {.n = n, .hash = (int64_t)flow_fnv(FLOW_FNV_START, ranks, (size_t)n * sizeof *ranks)};
  int lead = ranks[0];
  for (int i = 0; i < n; i++) {
    if (i < GROUP_LIST) mine.ranks[i] = ranks[i];
    if (ranks[i] < lead) lead = ranks[i];
  }
  int tag_record = 13 + 16 * channel, tag_verdict = 14 + 16 * channel, rc = 0;
  char verdict[512] = "", a[160], b[160];
  if (world->rank != lead) { /* a member: the group to the lowest rank, then its verdict */
    flow_comm_msg send = {lead, &mine, sizeof mine}, recv = {lead, verdict, sizeof verdict};
    rc = world->ops->exchange(world, &send, 1, NULL, 0, FLOW_U8, tag_record);
    if (rc == 0) rc = poll_each(&recv, 1, tag_verdict, flow_comm_timeout() + 2, "communicator"); /* the lowest rank gives up first */
    verdict[sizeof verdict - 1] = 0;
    if (rc > 0)
      return flow_error_set("[rank %d] communicator for ranks %s: rank %d, the group's lowest rank, did not answer "
                            "within FLOW_TIMEOUT + 2 s (it skipped this op or names another group)", world->rank,
                            rank_list(a, sizeof a, mine.ranks, n), lead);
    if (rc < 0) return -1;
    return verdict[0] ? flow_error_set("[rank %d] %s", world->rank, verdict) : 0;
  }
  group_record *got = calloc((size_t)n, sizeof *got);
  flow_comm_msg *msgs = calloc((size_t)n, sizeof *msgs);
  if (!got || !msgs) { free(got); free(msgs); return flow_error_set("communicator: out of memory"); }
  int m = 0;
  for (int i = 0; i < n; i++)
    if (ranks[i] != lead) msgs[m++] = (flow_comm_msg){ranks[i], &got[i], sizeof got[i]};
  rc = poll_each(msgs, m, tag_record, flow_comm_timeout(), "communicator");
  if (rc != 0) {
    free(got);
    free(msgs);
    if (rc < 0) return -1;
    return flow_error_set("[rank %d] communicator for ranks %s: a member did not come within FLOW_TIMEOUT (it "
                          "skipped this op or names another group)", world->rank, rank_list(a, sizeof a, mine.ranks, n));
  }
  for (int i = 0; i < n && !verdict[0]; i++)
    if (ranks[i] != lead && (got[i].n != n || got[i].hash != mine.hash))
      snprintf(verdict, sizeof verdict, "communicator: the ranks name different groups (a placement listed in "
               "another order, or another placement): rank %d has %s, rank %d has %s", lead,
               rank_list(a, sizeof a, mine.ranks, n), ranks[i], rank_list(b, sizeof b, got[i].ranks,
               got[i].n < 0 ? 0 : got[i].n));
  for (int i = 0, k = 0; i < n; i++)
    if (ranks[i] != lead) msgs[k++] = (flow_comm_msg){ranks[i], verdict, sizeof verdict};
  rc = world->ops->exchange(world, msgs, m, NULL, 0, FLOW_U8, tag_verdict);
  free(got);
  free(msgs);
  if (rc != 0) return -1;
  return verdict[0] ? flow_error_set("[rank %d] %s", world->rank, verdict) : 0;
}

flow_comm *flow_comm_for_ranks(const int *ranks, int n) {
  if (!world && flow_comm_init() != 0) return NULL;
  bool all = n == world->size; /* every rank in world order: the world itself, not a copy of it */
  for (int i = 0; i < n && all; i++) all = ranks[i] == i;
  if (all && channel == 0) return world;
  pthread_mutex_lock(&cache_lock);
  cached *c = cache;
  while (c && !(c->n == n && c->channel == channel && memcmp(c->ranks, ranks, (size_t)n * sizeof(int)) == 0)) c = c->next;
  pthread_mutex_unlock(&cache_lock);
  if (c) return c->comm;
  bool member = false;
  for (int i = 0; i < n; i++) member |= ranks[i] == world->rank;
  if (!member) {
    flow_error_set("[rank %d] communicator: this rank is not one of the group's ranks", world->rank);
    return NULL;
  }
  c = calloc(1, sizeof *c);
  if (c) c->ranks = malloc((size_t)n * sizeof(int));
  if (!c || !c->ranks) { if (c) free(c); flow_error_set("communicator: out of memory"); return NULL; }
  memcpy(c->ranks, ranks, (size_t)n * sizeof(int));
  c->n = n;
  c->channel = channel;
  if (agree_on_group(ranks, n) != 0 || world->ops->group(world, ranks, n, &c->comm) != 0) {
    free(c->ranks);
    free(c);
    return NULL;
  }
  pthread_mutex_lock(&cache_lock);
  c->next = cache;
  cache = c;
  pthread_mutex_unlock(&cache_lock);
  return c->comm;
}

/* Polling with back-off, for waits on peers: spin briefly first, so quick exchanges keep their
 * latency, then yield the core for a millisecond (ranks sharing a core get to run: the peer being
 * waited for may be one), then nap (doubling up to 200 us) to give the core away while nothing
 * arrives: a rank that waits on a peer (a pipeline stage waiting for the previous one's
 * activations) would otherwise spin on a core its own compute thread needs. */
void flow_comm_backoff_start(flow_comm_backoff *b) {
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
double flow_comm_backoff_pause(flow_comm_backoff *b) {
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

static volatile sig_atomic_t interrupted;
void flow_comm_set_interrupted(int on) { interrupted = on; }
int flow_comm_interrupted(void) { return interrupted; }

/* ---- notices: the REPL's failed line (comm.h) ------------------------------------------------------ */

enum { TAG_NOTICE = 15 }; /* on the world's data communicator (transfers use 12 + 16 k, groups 13, 14) */
typedef struct notice {
  uint64_t epoch;
  int32_t rank;
  char msg[500];
} notice;
static unsigned long long notice_epoch;
static bool notices_on, have_notice;
static notice first_notice;
static pthread_mutex_t notice_lock = PTHREAD_MUTEX_INITIALIZER; /* the REPL's watcher thread polls too */

void flow_comm_notices_begin(unsigned long long epoch) {
  notices_on = world && world->size > 1 && world->ops->poll && channel == 0;
  notice_epoch = epoch;
  have_notice = false;
}

void flow_comm_notify_all(const char *msg) {
  if (!notices_on) return;
  notice n = {.epoch = notice_epoch, .rank = world->rank};
  snprintf(n.msg, sizeof n.msg, "%s", msg ? msg : "");
  flow_comm_msg *to = calloc((size_t)world->size, sizeof *to);
  if (!to) return;
  int k = 0;
  for (int q = 0; q < world->size; q++)
    if (q != world->rank) to[k++] = (flow_comm_msg){q, &n, sizeof n};
  char keep[1024];
  snprintf(keep, sizeof keep, "%s", flow_error_get());
  world->ops->exchange(world, to, k, NULL, 0, FLOW_U8, TAG_NOTICE); /* small: out at once */
  flow_error_set("%s", keep);
  free(to);
}

int flow_comm_noticed(flow_comm *c, const char *what) {
  if (!notices_on || (c && c == world) || channel != 0) return 0;
  notice n;
  pthread_mutex_lock(&notice_lock);
  while (!have_notice && world->ops->poll(world, &n, sizeof n, TAG_NOTICE, -1) >= 0)
    if (n.epoch == notice_epoch) { /* older lines' notices are dropped */
      n.msg[sizeof n.msg - 1] = 0;
      first_notice = n;
      have_notice = true;
    }
  pthread_mutex_unlock(&notice_lock);
  if (!have_notice) return 0;
  return flow_error_set("[rank %d] %s: rank %d failed: %s", world->rank, what ? what : "handshake",
                        (int)first_notice.rank, flow_error_unranked(first_notice.msg));
}

void flow_comm_notices_end(void) {
  notice n;
  pthread_mutex_lock(&notice_lock);
  if (notices_on)
    while (world->ops->poll(world, &n, sizeof n, TAG_NOTICE, -1) >= 0) {}
  notices_on = have_notice = false;
  pthread_mutex_unlock(&notice_lock);
}

/* A cached communicator's name, the same on each of its members: its channel and ranks. */
static uint64_t cache_key(const cached *c) {
  int head[2] = {c->n, c->channel};
  return flow_fnv(flow_fnv(FLOW_FNV_START, head, sizeof head), c->ranks, (size_t)c->n * sizeof *c->ranks);
}

int flow_comm_resync(void) {
  if (!world || world->size < 2 || !world->ops->seq) return 0;
  typedef struct { uint64_t key; unsigned long long seq; } entry;
  pthread_mutex_lock(&cache_lock);
  int n = 0;
  for (cached *c = cache; c; c = c->next) n += c->ranks && c->comm->ops->seq;
  entry *mine = calloc((size_t)n + 1, sizeof *mine);
  n = 0;
  for (cached *c = cache; c && mine; c = c->next)
    if (c->ranks && c->comm->ops->seq) mine[n++] = (entry){cache_key(c), c->comm->ops->seq(c->comm, NULL)};
  pthread_mutex_unlock(&cache_lock);
  if (!mine) return flow_error_set("resync: out of memory");
  char *all;
  size_t *lens;
  int rc = flow_comm_allgather_bytes(world, mine, (size_t)n * sizeof *mine, &all, &lens);
  free(mine);
  if (rc != 0) return -1;
  size_t total = 0;
  for (int q = 0; q < world->size; q++) total += lens[q];
  const entry *every = (const entry *)all; /* malloc'd: aligned; this rank's own entries among them */
  pthread_mutex_lock(&cache_lock);
  for (cached *c = cache; c; c = c->next) {
    if (!c->ranks || !c->comm->ops->seq) continue;
    uint64_t key = cache_key(c);
    unsigned long long top = c->comm->ops->seq(c->comm, NULL);
    for (size_t i = 0; i < total / sizeof *every; i++)
      if (every[i].key == key && every[i].seq > top) top = every[i].seq;
    c->comm->ops->seq(c->comm, &top);
  }
  pthread_mutex_unlock(&cache_lock);
  free(all);
  free(lens);
  return 0;
}

/* ---- bytes ------------------------------------------------------------------------------------- */

int flow_comm_allgather_bytes(flow_comm *c, const void *buf, size_t len, char **all, size_t **lens) {
  int n = c->size;
  int64_t mine = (int64_t)len, *sizes = malloc((size_t)n * sizeof *sizes);
  size_t *counts = calloc(2 * (size_t)n, sizeof *counts), total = 0;
  *all = NULL;
  *lens = NULL;
  if (!sizes || !counts) {
    free(sizes);
    free(counts);
    return flow_error_set("allgather: out of memory");
  }
  for (int r = 0; r < n; r++) { counts[r] = 1; counts[n + r] = (size_t)r; }
  int rc = c->ops->allgatherv(c, &mine, 1, sizes, counts, counts + n, FLOW_I64);
  for (int r = 0; rc == 0 && r < n; r++) { counts[r] = (size_t)sizes[r]; counts[n + r] = total; total += counts[r]; }
  if (rc == 0 && !(*all = malloc(total + 1))) rc = flow_error_set("allgather: out of memory");
  if (rc == 0) rc = c->ops->allgatherv(c, buf, len, *all, counts, counts + n, FLOW_U8);
  if (rc == 0) {
    (*all)[total] = 0;
    *lens = counts; /* the first n entries are the lengths */
    counts = NULL;
  } else {
    free(*all);
    *all = NULL;
  }
  free(sizes);
  free(counts);
  return rc;
}

int flow_comm_broadcast_bytes(flow_comm *c, char **buf, long long *len, int root) {
  int64_t n = *len;
  if (c->ops->broadcast(c, &n, 1, FLOW_I64, root) != 0) return -1;
  *len = n;
  if (n < 0) return 0;
  if (c->rank != root && !(*buf = malloc((size_t)n + 1))) return flow_error_set("broadcast: out of memory");
  if (c->ops->broadcast(c, *buf, (size_t)n, FLOW_U8, root) != 0) {
    if (c->rank != root) { free(*buf); *buf = NULL; }
    return -1;
  }
  if (c->rank != root) (*buf)[n] = 0;
  return 0;
}
