/* The communicator backend of `flowlua --ranks N` (comm.h): the ranks are processes forked by one
 * flowlua (comm_launch.c), joined by a ring in shared memory per ordered pair (comm_ring.c) and a
 * full mesh of Unix-domain socket pairs, and every collective is point-to-point messages over them.
 *
 * Why processes and not threads with a Lua state each: a rank's state lives in process globals
 * (interned placements, the world and its cached communicators, the agreement check, the RNG, the
 * kernel caches), as it does under mpirun. A process per rank isolates them as mpirun does, with
 * nothing to move into a per-rank context, so the semantics are mpirun's by construction. */
#define _GNU_SOURCE /* CPU_COUNT */
#include "comm_local.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm_backend.h"
#include "hash.h"
#include "comm_ring.h"
#include "error.h"

/* ---- the transport: messages with a (communicator, tag) header, matched on arrival --------------
 * A message is its header and its bytes, written in order into the ring to its receiver, in
 * chunks as room frees (a message larger than the ring streams through it while the receiver
 * drains it). The receiver takes the bytes off each ring as they come, rebuilds the messages and
 * queues them whole, in arrival order, with their sender. A receive takes the first queued message
 * from its peer with its communicator and tag (so messages between two ranks with the same
 * communicator and tag arrive in the order they were sent).
 *
 * A large receive that waits before its message comes takes it straight into its own buffer.
 *
 * A thread waiting for a message drains the rings itself: for its first SPIN_US it looks again at
 * once, then it sleeps on the rank's bell, which a peer rings when it writes. A sender whose ring
 * is full drains its own rings meanwhile (SPIN_US), then sleeps until room frees; if the receiver
 * is busy elsewhere, the sender's byte on their socket (the doorbell) wakes the receiver's reader
 * thread, which drains the rings, so sends never deadlock: every peer keeps reading. The sockets
 * carry nothing else: a peer's socket closes when it exits or dies, which is how a rank sees a
 * peer leave (after taking what it wrote). Threads of one rank (a graph's forward and backward
 * collective streams) use the transport at once: one thread drains at a time, and a lock per peer
 * keeps their sends whole in the ring. */

/* A waiting thread looks again at once for SPIN_US before it sleeps (a quick answer is seen at
 * once; a longer wait leaves the core to this rank's other threads, a graph's compute, and to the
 * machine's other work), yielding its core between looks when the ranks outnumber the cores, as
 * mpirun's ranks do when oversubscribed. */
enum { SPIN_US = 200 };

typedef struct header {
  uint64_t comm;
  int32_t tag, pad;
  uint64_t len;
} header;

typedef struct msg {
  struct msg *next;
  uint64_t comm;
  int src, tag;
  size_t len, cap;  /* cap: the bytes data holds */
  char *data;
  bool borrowed;    /* data is a waiting receive's own buffer */
} msg;

/* A receive whose thread drains the rings: the first message that matches it goes straight into
 * its buffer instead of through a message buffer. */
typedef struct want {
  uint64_t comm;
  int src, tag;     /* src -1: nothing more to claim */
  char *buf;
  size_t bytes;
  bool claimed;
} want;

/* A message from a peer while it is rebuilt from its ring. */
typedef struct partial {
  header h;
  size_t hgot;  /* bytes of h so far */
  msg *m;       /* once h is whole */
  size_t got;   /* bytes of m->data so far */
  bool lost;    /* a message found no memory here: nothing more is read from this peer */
} partial;

static struct {
  int rank, size;               /* in the world; size 0: not a launched rank */
  int aborts;                   /* the pipe to the launcher for abort notices */
  bool crowded;                 /* more ranks than cores */
  flow_ring_region *shm;
  int *fd;                      /* fd[q]: the socket to world rank q */
  partial *in;                  /* in[q]: the message from q being rebuilt (under read_lock) */
  bool *gone;                   /* rank q's connection closed: it exited or died */
  pthread_mutex_t *send_lock;   /* one per peer */
  pthread_mutex_t read_lock;    /* held by the thread draining the rings */
  pthread_mutex_t lock;         /* the queue and gone[] */
  msg *head, *tail;
} T = {.lock = PTHREAD_MUTEX_INITIALIZER, .read_lock = PTHREAD_MUTEX_INITIALIZER};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Queue the messages of the list m (linked by next); wake the rank's sleeping threads. */
/* ---- message buffers --------------------------------------------------------------------------
 * Freed buffers of large messages are kept (up to SPARE_MAX bytes) for the next ones: a large
 * message into fresh memory pays a page fault per 4 KB, which costs more than moving its bytes. The
 * collectives take their scratch space here too. */

enum { SPARE_MIN = 64 << 10 };
static const size_t SPARE_MAX = (size_t)64 << 20;

static struct {
  pthread_mutex_t lock;
  msg *list;
  size_t bytes;
} spare = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* A message of len bytes (a kept buffer if one is large enough); NULL when out of memory. */
static msg *msg_new(size_t len) {
  msg *m = NULL;
  if (len >= SPARE_MIN) {
    pthread_mutex_lock(&spare.lock);
    for (msg **p = &spare.list; *p; p = &(*p)->next)
      if ((*p)->cap >= len) {
        m = *p;
        *p = m->next;
        spare.bytes -= m->cap;
        break;
      }
    pthread_mutex_unlock(&spare.lock);
  }
  if (!m) {
    char *d = malloc(len + 1);
    if (!d || !(m = malloc(sizeof *m))) { free(d); return NULL; }
    m->data = d;
    m->cap = len;
  }
  m->next = NULL;
  m->len = len;
  m->borrowed = false;
  return m;
}

static void drop(msg *m) {
  if (!m) return;
  if (m->borrowed) { free(m); return; }
  if (m->cap >= SPARE_MIN) {
    pthread_mutex_lock(&spare.lock);
    bool keep = spare.bytes + m->cap <= SPARE_MAX;
    if (keep) {
      m->next = spare.list;
      spare.list = m;
      spare.bytes += m->cap;
    }
    pthread_mutex_unlock(&spare.lock);
    if (keep) return;
  }
  free(m->data);
  free(m);
}

/* ---- moving messages ---------------------------------------------------------------------------- */

static void enqueue(msg *m, msg *last) {
  pthread_mutex_lock(&T.lock);
  if (T.tail) T.tail->next = m;
  else T.head = m;
  T.tail = last;
  pthread_mutex_unlock(&T.lock);
  flow_ring_bell_ring(T.shm, T.rank);
}

/* A message for the receive w, straight into its buffer; NULL if it is not the one. */
static msg *claim(want *w, int q, const header *h) {
  if (!w || w->src != q || w->comm != h->comm || w->tag != h->tag || w->bytes != h->len) return NULL;
  msg *m = malloc(sizeof *m);
  if (!m) return NULL;
  *m = (msg){.len = w->bytes, .cap = w->bytes, .data = w->buf, .borrowed = true};
  w->src = -1;
  w->claimed = true;
  return m;
}

/* Take what rank q's ring holds into in[q], adding each message it completes to the list *first ..
 * *last; false when out of memory. The caller holds read_lock, and the queue holds no message for
 * w (if any). */
static bool drain_one(int q, want *w, msg **first, msg **last) {
  partial *in = &T.in[q];
  for (;;) {
    if (!in->m) {
      if (in->hgot < sizeof in->h) {
        size_t k = flow_ring_get(T.shm, q, T.rank, (char *)&in->h + in->hgot, sizeof in->h - in->hgot);
        if (k == 0) return true;
        in->hgot += k;
        continue;
      }
      msg *m = claim(w, q, &in->h);
      if (!m && !(m = msg_new(in->h.len))) return false;
      m->comm = in->h.comm;
      m->src = q;
      m->tag = in->h.tag;
      in->m = m;
      in->got = 0;
    }
    msg *m = in->m;
    in->got += flow_ring_get(T.shm, q, T.rank, m->data + in->got, m->len - in->got);
    if (in->got < m->len) return true;
    if (w && w->src == q && w->comm == m->comm && w->tag == m->tag) w->src = -1; /* the first for w: not claimed */
    if (*last) (*last)->next = m;
    else *first = m;
    *last = m;
    in->m = NULL;
    in->hgot = 0;
  }
}

/* Peer q is gone (its connection closed, or its message found no memory here): say so to the
 * rank's threads, which then fail what they wait for from q. */
static void mark_gone(int q) {
  pthread_mutex_lock(&T.lock);
  T.gone[q] = true;
  pthread_mutex_unlock(&T.lock);
  flow_ring_bell_ring(T.shm, T.rank);
  flow_ring_wake_room(T.shm, T.rank, q);
}

/* Peer q's message found no memory here (the caller holds read_lock): it ends q's part as a
 * closed connection would. */
static void lose(int q) {
  T.in[q].lost = true;
  mark_gone(q);
}

/* Drain every peer's ring and queue the messages completed (w's first straight into its buffer);
 * the caller holds read_lock. Returns how many. */
static int drain(want *w) {
  msg *first = NULL, *last = NULL;
  for (int q = 0; q < T.size; q++)
    if (q != T.rank && !T.in[q].lost && !drain_one(q, w, &first, &last)) lose(q);
  int n = 0;
  for (msg *m = first; m; m = m->next) n++;
  if (first) enqueue(first, last);
  return n;
}

/* The reader thread: sleeps on the sockets; a peer's doorbell byte (it waits for room in its ring)
 * has it drain the rings, a closed socket has it take what the peer left and mark the peer gone. */
static void *reader(void *arg) {
  (void)arg;
  int n = T.size;
  struct pollfd p[n];
  for (int q = 0; q < n; q++) p[q] = (struct pollfd){.fd = T.fd[q], .events = POLLIN};
  for (int open = n - 1; open > 0;) {
    if (poll(p, (nfds_t)n, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int q = 0; q < n; q++) {
      if (p[q].fd < 0 || !p[q].revents) continue;
      char bytes[64];
      ssize_t k = recv(p[q].fd, bytes, sizeof bytes, MSG_DONTWAIT);
      bool closed = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
      pthread_mutex_lock(&T.read_lock);
      drain(NULL);
      pthread_mutex_unlock(&T.read_lock);
      if (closed) {
        p[q].fd = -1;
        open--;
        mark_gone(q);
      }
    }
  }
  return NULL;
}

enum { GOT, TIMED_OUT, GONE };

/* Under T.lock: unlink and return the first queued message from src with this communicator and
 * tag; NULL if none. */
static msg *find(uint64_t comm, int src, int tag) {
  msg *prev = NULL, *m = T.head;
  while (m && !(m->src == src && m->comm == comm && m->tag == tag)) { prev = m; m = m->next; }
  if (!m) return NULL;
  if (prev) prev->next = m->next;
  else T.head = m->next;
  if (T.tail == m) T.tail = prev;
  m->next = NULL;
  return m;
}

/* The queued message for the receive w, and whether its sender is gone (under T.lock). */
static msg *find_for(const want *w, int src, bool *gone) {
  pthread_mutex_lock(&T.lock);
  msg *m = find(w->comm, src, w->tag);
  *gone = T.gone[src];
  pthread_mutex_unlock(&T.lock);
  return m;
}

/* A receive that gives up while a message it claimed is still arriving: that message, if it came
 * whole meanwhile; else its bytes so far move to a message buffer of its own, and it arrives there. */
static msg *unclaim(want *w, int src) {
  pthread_mutex_lock(&T.read_lock); /* no drain writes into w->buf meanwhile */
  bool gone;
  msg *m = find_for(w, src, &gone), *in = T.in[src].m;
  if (!m && in && in->borrowed && in->data == w->buf) {
    msg *own = msg_new(in->len);
    if (own) {
      memcpy(own->data, in->data, T.in[src].got);
      in->data = own->data;
      in->cap = own->cap;
      in->borrowed = false;
      free(own);
    } else {
      T.in[src].m = NULL;
      free(in);
      lose(src);
    }
  }
  pthread_mutex_unlock(&T.read_lock);
  return m;
}

/* The first message from world rank src with this communicator and tag, waiting until `deadline`
 * (now_s() time; a past one only looks). A large one may arrive straight into buf (bytes long; buf
 * NULL: never). *why says why it returns NULL. */
static msg *take(uint64_t comm, int src, int tag, void *buf, size_t bytes, double deadline, int *why) {
  double start = now_s();
  want w = {.comm = comm, .src = src, .tag = tag, .buf = buf, .bytes = bytes};
  bool direct = buf && bytes >= SPARE_MIN, gone;
  msg *m;
  for (;;) {
    m = NULL;
    double now = now_s(), left = deadline - now;
    bool sleep = now - start > SPIN_US * 1e-6;
    uint32_t seen = sleep ? flow_ring_bell_arm(T.shm, T.rank) : 0;
    /* while another thread drains, this one does not sleep: that drain may have missed what
     * rang the bell since it was armed */
    bool looked = pthread_mutex_trylock(&T.read_lock) == 0;
    if (looked) {
      m = direct && !w.claimed ? find_for(&w, src, &gone) : NULL; /* one queued already comes first */
      if (!m) drain(direct ? &w : NULL);
      pthread_mutex_unlock(&T.read_lock);
    }
    if (!m) m = find_for(&w, src, &gone);
    *why = m ? GOT : gone ? GONE : left <= 0 ? TIMED_OUT : -1;
    if (sleep) flow_ring_bell_wait(T.shm, T.rank, seen, *why < 0 && looked ? (left > 1 ? 1 : left) : 0);
    if (*why >= 0) break;
    if ((!sleep && T.crowded) || !looked) sched_yield();
  }
  if (!m && w.claimed && (m = unclaim(&w, src))) *why = GOT;
  return m;
}

/* Write n bytes into the ring to dst, waiting for room; the caller holds send_lock[dst]. 1 when
 * dst is gone, 2 when dst took nothing for `patience` seconds. */
static int write_ring(int dst, const char *p, size_t n, double patience) {
  double progress = now_s();
  while (n > 0) {
    size_t k = flow_ring_put(T.shm, T.rank, dst, p, n);
    if (k > 0) { p += k; n -= k; progress = now_s(); continue; }
    if (pthread_mutex_trylock(&T.read_lock) == 0) { /* dst may be sending to this rank meanwhile */
      drain(NULL);
      pthread_mutex_unlock(&T.read_lock);
    }
    double now = now_s(), left = progress + patience - now;
    if (now - progress < SPIN_US * 1e-6) {
      if (T.crowded) sched_yield();
      continue;
    }
    uint32_t seen = flow_ring_room_arm(T.shm, T.rank, dst);
    pthread_mutex_lock(&T.lock);
    bool gone = T.gone[dst];
    pthread_mutex_unlock(&T.lock);
    if (!gone && left > 0) /* the doorbell: dst's reader thread drains if no thread of dst does */
      send(T.fd[dst], "", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    k = gone || left <= 0 ? 0 : flow_ring_put(T.shm, T.rank, dst, p, n);
    flow_ring_room_wait(T.shm, T.rank, dst, seen, gone || left <= 0 || k > 0 ? 0 : left > 1 ? 1 : left);
    if (gone) return 1;
    if (left <= 0) return 2;
    p += k;
    n -= k;
    if (k > 0) progress = now_s();
  }
  return 0;
}

/* Send len bytes to world rank dst (to itself: straight into the queue). 1 when dst has gone, 2
 * when dst took nothing for `patience` seconds, -1 out of memory. */
static int put(uint64_t comm, int dst, int tag, const void *buf, size_t len, double patience) {
  if (dst == T.rank) {
    msg *m = msg_new(len);
    if (!m) return -1;
    if (len) memcpy(m->data, buf, len);
    m->comm = comm;
    m->src = dst;
    m->tag = tag;
    enqueue(m, m);
    return 0;
  }
  header h = {.comm = comm, .tag = tag, .len = len};
  pthread_mutex_lock(&T.send_lock[dst]);
  int rc = write_ring(dst, (const char *)&h, sizeof h, patience);
  if (rc == 0) rc = write_ring(dst, buf, len, patience);
  pthread_mutex_unlock(&T.send_lock[dst]);
  return rc;
}

/* ---- communicators -------------------------------------------------------------------------- */

typedef struct local_comm {
  uint64_t id;              /* the same on every member: messages carry it */
  int *world;               /* world[i]: the world rank of member i */
  unsigned long long seq;   /* handshakes made on it so far: the same count on every member */
} local_comm;

static local_comm *impl(flow_comm *c) { return c->impl; }

static const flow_comm_ops local_ops;

static flow_comm *comm_new(uint64_t id, int rank, int size, const int *world) {
  flow_comm *c = calloc(1, sizeof *c);
  local_comm *l = calloc(1, sizeof *l);
  int *w = malloc((size_t)size * sizeof *w);
  if (!c || !l || !w) {
    free(c); free(l); free(w);
    flow_error_set("communicator: out of memory");
    return NULL;
  }
  memcpy(w, world, (size_t)size * sizeof *w);
  *l = (local_comm){.id = id, .world = w};
  *c = (flow_comm){.ops = &local_ops, .impl = l, .rank = rank, .size = size};
  return c;
}

/* ---- sending and receiving on a communicator -------------------------------------------------- */

enum { TAG_DATA = -1, TAG_RECORD = -2, TAG_VERDICT = -3, TAG_WITHDRAW = -4 };

/* A data transfer that makes no progress for FLOW_TIMEOUT + FLOW_WATCHDOG_GRACE runs after a handshake that saw
 * every rank arrive: a peer stopped inside it. As the MPI backend's watchdog does, end the job. */
/* How long such a transfer may wait before it is stuck. */
static double stuck_after(void) { return flow_comm_timeout() + flow_comm_grace(); }

static void stuck(const char *what, double waited) {
  fprintf(stderr, "[rank %d] %s: no progress for %.0f s (FLOW_TIMEOUT %.0f s + %.0f s): a peer rank died or stopped "
          "inside this collective, or never called it; ending the job\n", T.rank, what, waited, flow_comm_timeout(),
          flow_comm_grace());
  flow_comm_local_abort(EXIT_FAILURE);
}

static int gone_error(const char *what, int world_rank) {
  return flow_error_set("[rank %d] %s: rank %d has exited (its connection closed)", T.rank, what, world_rank);
}

static int send_to(flow_comm *c, int peer, int tag, const void *buf, size_t bytes, const char *what) {
  double patience = stuck_after();
  int rc = put(impl(c)->id, impl(c)->world[peer], tag, buf, bytes, patience);
  if (rc == 2) stuck(what, patience);
  if (rc == 1) return gone_error(what, impl(c)->world[peer]);
  if (rc < 0) return flow_error_set("%s: out of memory", what);
  return 0;
}

/* Receive exactly `bytes` from member peer. Nothing for FLOW_TIMEOUT seconds is an error when soft
 * (a transfer without a handshake before it); else the job ends after FLOW_TIMEOUT + the grace (stuck). */
static int recv_from(flow_comm *c, int peer, int tag, void *buf, size_t bytes, const char *what, bool soft) {
  double patience = soft ? flow_comm_timeout() : stuck_after(), start = now_s();
  int why, src = impl(c)->world[peer];
  msg *m = take(impl(c)->id, src, tag, buf, bytes, start + patience, &why);
  if (why == GONE) return gone_error(what, src);
  if (why == TIMED_OUT) {
    if (!soft) stuck(what, now_s() - start);
    return flow_error_set("[rank %d] %s: nothing arrived for %.0f s (FLOW_TIMEOUT): a peer rank stopped or skipped "
                          "this transfer", T.rank, what, now_s() - start);
  }
  int rc = 0;
  if (m->len != bytes)
    rc = flow_error_set("[rank %d] %s: rank %d sent %zu bytes where %zu were expected (the ranks called different "
                        "collectives or sizes)", T.rank, what, src, m->len, bytes);
  else if (bytes && m->data != buf) memcpy(buf, m->data, bytes);
  drop(m);
  return rc;
}

/* ---- data collectives: linear exchanges of blocks, sums in rank order --------------------------- */

/* Block q of send (scounts[q] elements at sdispls[q]) to member q; member q's block for this rank
 * into recv at rdispls[q]. Every send goes first: the peers' reader threads take them whatever they do. */
static int l_alltoallv(flow_comm *c, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
                       const size_t *rcounts, const size_t *rdispls, flow_dtype dt) {
  size_t es = flow_dtype_size(dt);
  for (int k = 1; k < c->size; k++) { /* rank + k: each peer hears from this rank in a different turn */
    int q = (c->rank + k) % c->size;
    if (send_to(c, q, TAG_DATA, (const char *)send + sdispls[q] * es, scounts[q] * es, "all-to-all") != 0) return -1;
  }
  if (rcounts[c->rank] != scounts[c->rank])
    return flow_error_set("all-to-all: %zu elements sent to this rank itself but %zu received", scounts[c->rank],
                          rcounts[c->rank]);
  memmove((char *)recv + rdispls[c->rank] * es, (const char *)send + sdispls[c->rank] * es, scounts[c->rank] * es);
  for (int k = 1; k < c->size; k++) {
    int q = (c->rank - k + c->size) % c->size;
    if (recv_from(c, q, TAG_DATA, (char *)recv + rdispls[q] * es, rcounts[q] * es, "all-to-all", false) != 0) return -1;
  }
  return 0;
}

static int l_alltoall(flow_comm *c, const void *send, void *recv, size_t count, flow_dtype dt) {
  size_t *v = malloc(2 * (size_t)c->size * sizeof *v);
  if (!v) return flow_error_set("all-to-all: out of memory");
  for (int q = 0; q < c->size; q++) { v[q] = count; v[c->size + q] = (size_t)q * count; }
  int rc = l_alltoallv(c, send, v, v + c->size, recv, v, v + c->size, dt);
  free(v);
  return rc;
}

static int l_allgatherv(flow_comm *c, const void *send, size_t count, void *recv, const size_t *counts,
                        const size_t *displs, flow_dtype dt) {
  size_t es = flow_dtype_size(dt);
  for (int k = 1; k < c->size; k++)
    if (send_to(c, (c->rank + k) % c->size, TAG_DATA, send, count * es, "all-gather") != 0) return -1;
  memmove((char *)recv + displs[c->rank] * es, send, count * es);
  for (int k = 1; k < c->size; k++) {
    int q = (c->rank - k + c->size) % c->size;
    if (recv_from(c, q, TAG_DATA, (char *)recv + displs[q] * es, counts[q] * es, "all-gather", false) != 0) return -1;
  }
  return 0;
}

/* Every member's block for this rank, then their sum in rank order (so it is the same sum
 * whichever rank computes it). */
static int l_reduce_scatterv(flow_comm *c, const void *send, void *recv, const size_t *counts, flow_dtype dt) {
  if (flow_comm_sum_check("reduce-scatter", dt)) return -1;
  int n = c->size, me = c->rank;
  size_t es = flow_dtype_size(dt), mine = counts[me];
  size_t *v = malloc(4 * (size_t)n * sizeof *v);
  msg *scratch = msg_new((size_t)n * mine * es);
  char *parts = scratch ? scratch->data : NULL;
  int rc = 0;
  if (!v || !parts) rc = flow_error_set("reduce-scatter: out of memory");
  for (int q = 0, off = 0; rc == 0 && q < n; off += (int)counts[q], q++) {
    v[q] = counts[q];
    v[n + q] = (size_t)off;
    v[2 * n + q] = mine;
    v[3 * n + q] = (size_t)q * mine;
  }
  if (rc == 0) rc = l_alltoallv(c, send, v, v + n, parts, v + 2 * n, v + 3 * n, dt);
  if (rc == 0) {
    memcpy(recv, parts, mine * es);
    for (int q = 1; q < n; q++) flow_comm_add_into(recv, parts + (size_t)q * mine * es, mine, dt);
  }
  drop(scratch);
  free(v);
  return rc;
}

static int l_allreduce(flow_comm *c, const void *send, void *recv, size_t count, flow_dtype dt) {
  if (flow_comm_sum_check("all-reduce", dt)) return -1;
  return flow_comm_allreduce_by_parts(c, send, recv, count, dt, l_reduce_scatterv, l_allgatherv);
}

/* Rows of a strided block, packed back to back into dst (pack) or out of src (unpack). */
static void move_block(char *strided, const flow_comm_block *b, char *dense, size_t es, bool pack) {
  for (size_t r = 0; r < b->rows; r++) {
    char *s = strided + (b->offset + r * b->stride) * es, *d = dense + r * b->run * es;
    if (pack) memcpy(d, s, b->run * es);
    else memcpy(s, d, b->run * es);
  }
}

static int l_alltoall_blocks(flow_comm *c, const void *send, const flow_comm_block *sblocks, void *recv,
                             const flow_comm_block *rblocks, flow_dtype dt) {
  size_t es = flow_dtype_size(dt), most = 0;
  for (int q = 0; q < c->size; q++) {
    if (sblocks[q].rows * sblocks[q].run > most) most = sblocks[q].rows * sblocks[q].run;
    if (rblocks[q].rows * rblocks[q].run > most) most = rblocks[q].rows * rblocks[q].run;
  }
  msg *scratch = msg_new(most * es);
  if (!scratch) return flow_error_set("all-to-all: out of memory");
  char *buf = scratch->data;
  int rc = 0;
  for (int k = 0; k < c->size && rc == 0; k++) { /* k = 0: this rank's own block, through the queue */
    int q = (c->rank + k) % c->size;
    move_block((char *)send, &sblocks[q], buf, es, true);
    rc = send_to(c, q, TAG_DATA, buf, sblocks[q].rows * sblocks[q].run * es, "all-to-all");
  }
  for (int k = 0; k < c->size && rc == 0; k++) {
    int q = (c->rank - k + c->size) % c->size;
    rc = recv_from(c, q, TAG_DATA, buf, rblocks[q].rows * rblocks[q].run * es, "all-to-all", false);
    if (rc == 0) move_block(recv, &rblocks[q], buf, es, false);
  }
  drop(scratch);
  return rc;
}

static int l_broadcast(flow_comm *c, void *buf, size_t count, flow_dtype dt, int root) {
  size_t bytes = count * flow_dtype_size(dt);
  if (c->rank != root) return recv_from(c, root, TAG_DATA, buf, bytes, "broadcast", false);
  for (int q = 0; q < c->size; q++)
    if (q != root && send_to(c, q, TAG_DATA, buf, bytes, "broadcast") != 0) return -1;
  return 0;
}

static int check_tag(int tag) {
  return tag < 0 ? flow_error_set("communicator: message tags are non-negative (got %d)", tag) : 0;
}

static int l_send(flow_comm *c, const void *buf, size_t count, flow_dtype dt, int peer, int tag) {
  if (check_tag(tag)) return -1;
  return send_to(c, peer, tag, buf, count * flow_dtype_size(dt), "send");
}

static int l_recv(flow_comm *c, void *buf, size_t count, flow_dtype dt, int peer, int tag) {
  if (check_tag(tag)) return -1;
  return recv_from(c, peer, tag, buf, count * flow_dtype_size(dt), "recv", false);
}

static int l_exchange(flow_comm *c, const flow_comm_msg *sends, int nsend, const flow_comm_msg *recvs, int nrecv,
                      flow_dtype dt, int tag) {
  size_t es = flow_dtype_size(dt);
  if (check_tag(tag)) return -1;
  for (int i = 0; i < nsend; i++)
    if (send_to(c, sends[i].peer, tag, sends[i].buf, sends[i].count * es, "exchange") != 0) return -1;
  for (int i = 0; i < nrecv; i++)
    if (recv_from(c, recvs[i].peer, tag, recvs[i].buf, recvs[i].count * es, "exchange", true) != 0) return -1;
  return 0;
}

/* ---- the handshake: agreement, liveness and the failure channel ---------------------------------
 * The MPI backend's protocol (comm_handshake.c; the verdict is comm_backend.c's), a star: every member sends the leader (member 0)
 * a record (the handshake's number on this communicator, its value, its op), and the leader
 * answers each with the verdict (min and max of the values, or who failed, or that it gave up), so
 * all move on or none do. A failing rank sends a record (as the leader, a verdict) marked failed
 * and goes on. The leader gives up after FLOW_TIMEOUT naming the ranks that did not come; the
 * others 2 s later, withdrawing their record. Messages of an older handshake are dropped. Here a
 * rank that exited is seen at once: its connection closes. */

typedef flow_comm_record record;

/* This handshake's record from member q with `tag` (older ones dropped) by the deadline; GOT,
 * TIMED_OUT or GONE, or -1 with an error when q is ahead. */
static int await_record(flow_comm *c, const char *what, int q, int tag, double deadline, record *r) {
  local_comm *l = impl(c);
  double start = now_s();
  for (;;) {
    int why;
    /* in slices of 20 ms after the first: between two, a notice of the REPL's failed line counts */
    double until = now_s() - start < 1e-3 ? start + 1e-3 : now_s() + 2e-2;
    msg *m = take(l->id, l->world[q], tag, NULL, 0, until < deadline ? until : deadline, &why);
    if (!m && why == TIMED_OUT && until < deadline) {
      if (flow_comm_noticed(c, what) != 0) return -1;
      if (flow_comm_interrupted()) return TIMED_OUT; /* Ctrl-C: give up now, as at the deadline */
      continue;
    }
    if (!m) return why;
    bool whole = m->len == sizeof *r;
    if (whole) memcpy(r, m->data, sizeof *r);
    drop(m);
    if (!whole || r->seq < l->seq) continue;
    if (r->seq > l->seq)
      return flow_error_set("[rank %d] handshake: rank %d is at handshake %llu but this rank at %llu: the ranks are "
                            "out of step", c->rank, q, r->seq, l->seq);
    return GOT;
  }
}

/* A member that gave up on this handshake (the leader was late): its withdraw message, if one came. */
static bool withdrawn(flow_comm *c, int *who) {
  local_comm *l = impl(c);
  for (int q = 1; q < c->size; q++)
    for (;;) {
      int why;
      msg *m = take(l->id, l->world[q], TAG_WITHDRAW, NULL, 0, 0, &why);
      if (!m) break;
      unsigned long long seq = 0;
      if (m->len == sizeof seq) memcpy(&seq, m->data, sizeof seq);
      drop(m);
      if (seq == l->seq) { *who = q; return true; }
    }
  return false;
}

/* The leader: gather every record, then send the verdict v to every member (also to those that did
 * not arrive, which find it when they do). */
static int lead(flow_comm *c, const char *what, long long mine, record *v) {
  local_comm *l = impl(c);
  int n = c->size, who = -1;
  double start = now_s(), deadline = start + flow_comm_timeout();
  record *got = calloc((size_t)n, sizeof *got);
  int *state = calloc((size_t)n, sizeof *state);
  if (!got || !state) { free(got); free(state); return flow_error_set("handshake: out of memory"); }
  bool late = false;
  for (int q = 1; q < n; q++) {
    int rc = await_record(c, what, q, TAG_RECORD, deadline, &got[q]);
    if (rc < 0) { free(got); free(state); return -1; }
    state[q] = rc == GOT ? FLOW_HS_ARRIVED : rc == GONE ? FLOW_HS_EXITED : FLOW_HS_LATE;
    late |= rc != GOT;
  }
  if (!late) withdrawn(c, &who);
  flow_comm_verdict(v, c, l->seq, what, mine, got, state, now_s() - start, who);
  free(got);
  free(state);
  for (int q = 1; q < n; q++) /* a member that exited hears nothing: no error here */
    if (put(l->id, l->world[q], TAG_VERDICT, v, sizeof *v, stuck_after()) == 2) stuck(what, stuck_after());
  return 0;
}

/* A member: send the record to the leader, wait for its verdict v. */
static int follow(flow_comm *c, const char *what, long long mine, record *v) {
  local_comm *l = impl(c);
  record r;
  flow_comm_record_fill(&r, l->seq, mine, FLOW_HS_OK, c->rank, what, "");
  if (send_to(c, 0, TAG_RECORD, &r, sizeof r, what) != 0) return -1;
  double start = now_s();
  int got = await_record(c, what, 0, TAG_VERDICT, start + flow_comm_timeout() + 2, v); /* the leader gives up first */
  if (got < 0) return -1;
  if (got == GONE)
    return flow_error_set("[rank %d] %s: rank %d, which leads this handshake, has exited", c->rank, what, l->world[0]);
  if (got == GOT) return 0;
  put(l->id, l->world[0], TAG_WITHDRAW, &l->seq, sizeof l->seq, 1);
  /* a leader that came just now may have answered before it saw the withdraw: its verdict, if it
   * comes at once, holds for every rank (a cancel, if it saw it) */
  if (await_record(c, what, 0, TAG_VERDICT, now_s() + 0.5, v) == GOT) return 0;
  if (flow_comm_interrupted())
    return flow_error_set("[rank %d] %s: interrupted after %.0f s waiting for rank 0, which leads this handshake",
                          c->rank, what, now_s() - start);
  return flow_error_set("[rank %d] %s: waited %.0f s (FLOW_TIMEOUT + 2 s) for rank 0, which leads this handshake and "
                        "did not answer (stopped, stuck, failed outside a global op or took another path)",
                        c->rank, what, now_s() - start);
}

static int l_handshake(flow_comm *c, const char *what, long long v, long long *min, long long *max) {
  *min = *max = v;
  if (c->size < 2) return 0;
  impl(c)->seq++;
  record r;
  int rc = c->rank == 0 ? lead(c, what, v, &r) : follow(c, what, v, &r);
  return rc != 0 ? rc : flow_comm_verdict_result(c, what, &r, min, max);
}

static void l_fail(flow_comm *c, const char *what, const char *msg) {
  if (c->size < 2) return;
  local_comm *l = impl(c);
  l->seq++;
  char keep[1024];
  snprintf(keep, sizeof keep, "%s", flow_error_get());
  record r;
  flow_comm_record_fill(&r, l->seq, 0, FLOW_HS_FAILED, c->rank, what, msg);
  for (int q = c->rank == 0 ? 1 : 0; q < (c->rank == 0 ? c->size : 1); q++)
    put(l->id, l->world[q], c->rank == 0 ? TAG_VERDICT : TAG_RECORD, &r, sizeof r, 1);
  flow_error_set("%s", keep);
}

/* ---- groups ------------------------------------------------------------------------------------
 * A group needs no messages: its id is a hash of its parent's, its members' world ranks, the
 * creating thread's comm channel (channels create groups at once) and how many groups with that
 * key this rank made before, which every member computes alike. */

typedef struct made { uint64_t key; int count; struct made *next; } made;
static made *made_list;
static pthread_mutex_t made_lock = PTHREAD_MUTEX_INITIALIZER;

static int l_group(flow_comm *c, const int *members, int n, flow_comm **out) {
  int *w = malloc((size_t)n * sizeof *w), me = -1, channel = flow_comm_channel();
  if (!w) return flow_error_set("communicator: out of memory");
  for (int i = 0; i < n; i++) {
    if (members[i] < 0 || members[i] >= c->size) {
      free(w);
      return flow_error_set("communicator group: no member %d in a communicator of %d", members[i], c->size);
    }
    w[i] = impl(c)->world[members[i]];
    if (members[i] == c->rank) me = i;
  }
  if (me < 0) { free(w); return flow_error_set("[rank %d] communicator group: this rank is not a member", T.rank); }
  uint64_t key = flow_fnv(flow_fnv(flow_fnv(FLOW_FNV_START, &impl(c)->id, sizeof(uint64_t)), &channel, sizeof channel), w,
                     (size_t)n * sizeof *w);
  pthread_mutex_lock(&made_lock);
  made *m = made_list;
  while (m && m->key != key) m = m->next;
  if (!m && (m = calloc(1, sizeof *m))) { m->key = key; m->next = made_list; made_list = m; }
  int k = m ? m->count++ : 0;
  pthread_mutex_unlock(&made_lock);
  *out = comm_new(flow_fnv(key, &k, sizeof k), me, n, w);
  free(w);
  return *out ? 0 : -1;
}

static int l_poll(flow_comm *c, void *buf, size_t cap, int tag, int peer) {
  local_comm *l = impl(c);
  for (int q = peer < 0 ? 0 : peer; q < (peer < 0 ? c->size : peer + 1); q++) {
    int why;
    msg *m = take(l->id, l->world[q], tag, NULL, 0, 0, &why); /* a past deadline: only looks */
    if (!m) continue;
    memcpy(buf, m->data, m->len < cap ? m->len : cap);
    drop(m);
    return q;
  }
  return -1;
}

static unsigned long long l_seq(flow_comm *c, const unsigned long long *set) {
  if (set) impl(c)->seq = *set;
  return impl(c)->seq;
}

static void l_free(flow_comm *c) {
  free(impl(c)->world);
  free(c->impl);
  free(c);
}

static const flow_comm_ops local_ops = {
    .allreduce = l_allreduce, .allgatherv = l_allgatherv, .reduce_scatterv = l_reduce_scatterv,
    .alltoall = l_alltoall, .alltoallv = l_alltoallv, .alltoall_blocks = l_alltoall_blocks,
    .broadcast = l_broadcast, .send = l_send, .recv = l_recv, .exchange = l_exchange, .barrier = flow_comm_handshake_barrier,
    .handshake = l_handshake, .fail = l_fail, .minmax = flow_comm_handshake_minmax, .group = l_group, .free = l_free,
    .poll = l_poll, .seq = l_seq};

/* ---- joining -------------------------------------------------------------------------------- */

void flow_comm_local_join(int rank, int size, const int *fd, flow_ring_region *shm, int aborts) {
  T.rank = rank;
  T.size = size;
  T.aborts = aborts;
  T.shm = shm;
  cpu_set_t cores;
  T.crowded = sched_getaffinity(0, sizeof cores, &cores) == 0 && size > CPU_COUNT(&cores);
  T.fd = malloc((size_t)size * sizeof *T.fd);
  T.in = calloc((size_t)size, sizeof *T.in);
  T.gone = calloc((size_t)size, sizeof *T.gone);
  T.send_lock = malloc((size_t)size * sizeof *T.send_lock);
  if (!T.fd || !T.in || !T.gone || !T.send_lock) {
    fprintf(stderr, "[rank %d] out of memory joining the ranks\n", rank);
    _exit(EXIT_FAILURE);
  }
  memcpy(T.fd, fd, (size_t)size * sizeof *fd);
  for (int q = 0; q < size; q++) pthread_mutex_init(&T.send_lock[q], NULL);
  pthread_t t;
  if (size > 1 && pthread_create(&t, NULL, reader, NULL) != 0) {
    fprintf(stderr, "[rank %d] cannot start the message reader\n", rank);
    _exit(EXIT_FAILURE);
  }
  if (size > 1) pthread_detach(t);
}

bool flow_comm_local_joined(void) { return T.size > 0; }

flow_comm *flow_comm_local_world(void) {
  if (T.size == 0) return NULL;
  int *w = malloc((size_t)T.size * sizeof *w);
  if (!w) { flow_error_set("communicator: out of memory"); return NULL; }
  for (int q = 0; q < T.size; q++) w[q] = q;
  flow_comm *c = comm_new(1, T.rank, T.size, w);
  free(w);
  return c;
}

void flow_comm_local_abort(int code) {
  if (T.size < 2) return;
  fflush(stdout);
  fflush(stderr);
  flow_comm_local_abort_notice a = {T.rank, code};
  if (write(T.aborts, &a, sizeof a) == (ssize_t)sizeof a) kill(getppid(), SIGUSR1); /* else it sees the exit */
  _exit(code);
}
