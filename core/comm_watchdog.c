/* The MPI backend's watchdog: it ends the job when a thread has been inside a blocking collective
 * for FLOW_TIMEOUT + FLOW_WATCHDOG_GRACE (10 s unless set; comm_mpi.h). */
#ifdef FLOW_HAVE_MPI
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "comm_mpi.h"

/* Data collectives run blocking, at the speed of MPI's tuned algorithms (its non-blocking ones are
 * slower), after a handshake saw every rank arrive. A peer that dies or stops between the two would
 * leave the others inside the collective for good: each thread marks when it entered one, and a
 * watchdog thread ends the job when a mark is older than FLOW_TIMEOUT + the grace. The marks cost a
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
    long long now = now_ns(), limit = (long long)((flow_comm_timeout() + flow_comm_grace()) * 1e9);
    int used = atomic_load(&watch_used);
    for (int i = 0; i < used && i < WATCH_SLOTS; i++) {
      long long since = atomic_load(&watch[i].since_ns);
      if (since == 0 || now - since <= limit) continue;
      fprintf(stderr, "[rank %d] %s: no progress for %.0f s (FLOW_TIMEOUT %.0f s + %.0f s): a peer rank died or "
              "stopped inside this collective, or never called it; ending the job\n", flow_comm_rank(),
              atomic_load(&watch[i].what), (double)(now - since) * 1e-9, flow_comm_timeout(), flow_comm_grace());
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
  pthread_create(&t, &a, watchdog, NULL);
  pthread_attr_destroy(&a);
}

void flow_comm_watch_enter(const char *what) {
  if (watch_slot < 0) {
    if (flow_comm_size() < 2) return;
    pthread_once(&watch_once, watchdog_start);
    watch_slot = atomic_fetch_add(&watch_used, 1);
  }
  if (watch_slot >= WATCH_SLOTS) return; /* more threads than slots: this one goes unwatched */
  atomic_store(&watch[watch_slot].what, what);
  atomic_store(&watch[watch_slot].since_ns, now_ns());
}

void flow_comm_watch_leave(void) {
  if (watch_slot >= 0 && watch_slot < WATCH_SLOTS) atomic_store(&watch[watch_slot].since_ns, 0);
}

#endif
