/* Shared-memory byte rings between the ranks of `flowlua --ranks N` (comm_ring.h).
 *
 * A ring is a byte stream: `head` counts the bytes its producer wrote, `tail` those its consumer
 * read (each written by one side only, on its own cache line); byte i lives at data[i % cap]. The
 * producer publishes bytes by a release store of head after copying them, the consumer frees room
 * by a release store of tail after copying them out.
 *
 * Sleeping is on futexes in the shared region: a rank's bell (bumped whenever a peer writes to it)
 * and a ring's `freed` (bumped whenever its consumer frees room). A waker bumps the word, then
 * makes the futex call only when someone counts as sleeping on it; a sleeper counts itself before
 * its last look, then sleeps only if the word has not moved. All four steps are sequentially
 * consistent, so either the waker sees the sleeper counted, or the sleeper's last look (or its
 * futex call) sees the waker's work: no wake-up is lost. */
#define _GNU_SOURCE
#include "comm_ring.h"

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct bell {
  _Alignas(64) atomic_uint rung;
  atomic_uint sleepers;
} bell;

typedef struct ring {
  _Alignas(64) atomic_uint_fast64_t head;
  _Alignas(64) atomic_uint_fast64_t tail;
  _Alignas(64) atomic_uint freed;
  atomic_uint waiting;
} ring;

struct flow_ring_region {
  int n;
  size_t cap;   /* a power of two */
  bell *bells;  /* bells[r]: rank r's */
  ring *rings;  /* rings[from * n + to] */
  char *data;   /* the bytes of rings[k] at data + k * cap */
};

/* ---- mapping ---------------------------------------------------------------------------------- */

/* Per ring, 1 MB (a 4 MB message then crosses in a few chunks while its consumer drains it), less
 * when many ranks would make the region large; its pages are touched only as rings are used. */
static size_t ring_capacity(int n) {
  size_t cap = (size_t)1 << 20, pairs = (size_t)n * (size_t)(n > 1 ? n - 1 : 1);
  while (cap > 4096 && cap * pairs > ((size_t)256 << 20)) cap /= 2;
  return cap;
}

flow_ring_region *flow_ring_map(int n) {
  flow_ring_region *s = malloc(sizeof *s);
  if (!s) return NULL;
  size_t cap = ring_capacity(n), nn = (size_t)n * (size_t)n;
  size_t bells = (size_t)n * sizeof(bell), rings = nn * sizeof(ring);
  void *base = mmap(NULL, bells + rings + nn * cap, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE,
                    -1, 0);
  if (base == MAP_FAILED) { free(s); return NULL; }
  /* a fresh anonymous mapping is zero: every counter starts at 0 */
  *s = (flow_ring_region){.n = n, .cap = cap, .bells = base, .rings = (ring *)((char *)base + bells),
                          .data = (char *)base + bells + rings};
  return s;
}

/* ---- futexes ---------------------------------------------------------------------------------- */

static void futex_wait(atomic_uint *w, unsigned seen, double seconds) {
  struct timespec t = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  syscall(SYS_futex, (unsigned *)w, FUTEX_WAIT, seen, &t, NULL, 0); /* shared: not FUTEX_PRIVATE */
}

static void futex_wake(atomic_uint *w) { syscall(SYS_futex, (unsigned *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

static void bump(atomic_uint *word, atomic_uint *sleepers) {
  atomic_fetch_add(word, 1);
  if (atomic_load(sleepers) > 0) futex_wake(word);
}

static uint32_t arm(atomic_uint *word, atomic_uint *sleepers) {
  atomic_fetch_add(sleepers, 1);
  return atomic_load(word);
}

static void wait_on(atomic_uint *word, atomic_uint *sleepers, uint32_t seen, double seconds) {
  if (seconds > 0 && atomic_load(word) == seen) futex_wait(word, seen, seconds);
  atomic_fetch_sub(sleepers, 1);
}

uint32_t flow_ring_bell_arm(flow_ring_region *s, int me) { return arm(&s->bells[me].rung, &s->bells[me].sleepers); }

void flow_ring_bell_wait(flow_ring_region *s, int me, uint32_t seen, double seconds) {
  wait_on(&s->bells[me].rung, &s->bells[me].sleepers, seen, seconds);
}

void flow_ring_bell_ring(flow_ring_region *s, int to) { bump(&s->bells[to].rung, &s->bells[to].sleepers); }

uint32_t flow_ring_room_arm(flow_ring_region *s, int from, int to) {
  ring *r = &s->rings[from * s->n + to];
  return arm(&r->freed, &r->waiting);
}

void flow_ring_room_wait(flow_ring_region *s, int from, int to, uint32_t seen, double seconds) {
  ring *r = &s->rings[from * s->n + to];
  wait_on(&r->freed, &r->waiting, seen, seconds);
}

void flow_ring_wake_room(flow_ring_region *s, int from, int to) {
  ring *r = &s->rings[from * s->n + to];
  bump(&r->freed, &r->waiting);
}

/* ---- moving bytes ----------------------------------------------------------------------------- */

size_t flow_ring_put(flow_ring_region *s, int from, int to, const void *p, size_t len) {
  ring *r = &s->rings[from * s->n + to];
  char *data = s->data + (size_t)(from * s->n + to) * s->cap;
  uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
  uint64_t room = s->cap - (head - atomic_load_explicit(&r->tail, memory_order_acquire));
  size_t k = len < room ? len : (size_t)room, at = (size_t)(head & (s->cap - 1));
  if (k == 0) return 0;
  size_t first = k < s->cap - at ? k : s->cap - at;
  memcpy(data + at, p, first);
  memcpy(data, (const char *)p + first, k - first);
  atomic_store_explicit(&r->head, head + k, memory_order_release);
  flow_ring_bell_ring(s, to);
  return k;
}

size_t flow_ring_get(flow_ring_region *s, int from, int to, void *p, size_t len) {
  ring *r = &s->rings[from * s->n + to];
  const char *data = s->data + (size_t)(from * s->n + to) * s->cap;
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  uint64_t ready = atomic_load_explicit(&r->head, memory_order_acquire) - tail;
  size_t k = len < ready ? len : (size_t)ready, at = (size_t)(tail & (s->cap - 1));
  if (k == 0) return 0;
  size_t first = k < s->cap - at ? k : s->cap - at;
  memcpy(p, data + at, first);
  memcpy((char *)p + first, data, k - first);
  atomic_store_explicit(&r->tail, tail + k, memory_order_release);
  bump(&r->freed, &r->waiting);
  return k;
}
