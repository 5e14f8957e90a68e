/* NCCL as the core sees it (see nccl.h): which GPU this rank drives, whether NCCL can carry the job,
 * and the cache of communicators, which the CUDA plugin makes (core/cuda/nccl.c). */
#include "nccl.h"

#include <stdbool.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "error.h"

/* ---- which GPU, and whether NCCL can carry this job ------------------------------------------- */

static bool probed, usable;
static int local_rank;
static char unusable_reason[300];

/* One collective over the world (every rank calls it, GPU or not, so the calls match): the
 * node-local rank picks the GPU, and NCCL is used only if every rank has a GPU of its own. NCCL
 * refuses two ranks of one communicator on the same GPU, so when ranks outnumber a node's GPUs
 * (mpirun -np 4 on a one-GPU machine) CUDA tensors are boxed through host memory over MPI instead.
 * The GPU count loads the CUDA plugin, except on a machine with no NVIDIA driver at all. */
int flow_nccl_init(void) {
  if (probed) return 0;
  probed = true;
  bool driver = flow_cuda_loaded() || flow_cuda_driver_present();
  int local_size, n = driver ? flow_cuda_device_count() : 0;
  if (flow_comm_node_local(&local_rank, &local_size) != 0) return -1;
  const char *env = getenv("FLOW_NCCL");
  long long bad = 0, lo, hi;
  if (n <= 0) bad = 1;
  else if (local_size > n) bad = 2;
  else if (env && strcmp(env, "0") == 0) bad = 3;
  flow_comm *w = flow_comm_world();
  if (w->ops->minmax(w, bad, &lo, &hi) != 0) return -1;
  usable = hi == 0;
  if (bad == 1)
    snprintf(unusable_reason, sizeof unusable_reason, "cuda is not available (%s)",
             driver ? flow_cuda_unavailable_reason() : "no GPU found: no NVIDIA driver");
  else if (bad == 2)
    snprintf(unusable_reason, sizeof unusable_reason, "%d ranks share this node's %d GPU%s", local_size, n, n == 1 ? "" : "s");
  else if (bad == 3) snprintf(unusable_reason, sizeof unusable_reason, "FLOW_NCCL=0");
  else if (hi == 1) snprintf(unusable_reason, sizeof unusable_reason, "a rank has no GPU");
  else if (hi == 2) snprintf(unusable_reason, sizeof unusable_reason, "ranks share a GPU on another node");
  else if (hi == 3) snprintf(unusable_reason, sizeof unusable_reason, "FLOW_NCCL=0 on another rank");
  return 0;
}

/* The accessors probe on first use: in a world of one the probe is local (a multi-rank world
 * probes when flow opens, on every rank). */
static bool probe(void) { return flow_nccl_init() == 0; }

bool flow_nccl_usable(void) { return probe() && usable; }
const char *flow_nccl_unusable_reason(void) { return !probe() ? flow_error_get() : usable ? "" : unusable_reason; }

int flow_nccl_device(void) {
  if (!probe()) return -1;
  int n = flow_cuda_device_count();
  if (n <= 0) return flow_error_set("nccl: cuda is not available (%s)", flow_cuda_unavailable_reason());
  return local_rank % n;
}

/* ---- the cache, keyed by the world ranks and the thread's channel (comm.h) ---------------------- */

typedef struct entry {
  int n, channel;
  int *ranks;
  flow_comm *comm;
  struct entry *next;
} entry;
static entry *cache;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER; /* the list only, never a creation */

flow_comm *flow_nccl_for_ranks(const int *ranks, int n) {
  int channel = flow_comm_channel();
  pthread_mutex_lock(&cache_lock);
  entry *found = cache;
  while (found && !(found->n == n && found->channel == channel && memcmp(found->ranks, ranks, (size_t)n * sizeof *ranks) == 0))
    found = found->next;
  pthread_mutex_unlock(&cache_lock);
  if (found) return found->comm;
  int device = flow_nccl_device();
  if (device < 0) return NULL;
  flow_comm *boot = flow_comm_for_ranks(ranks, n);
  if (!boot) return NULL;
  flow_comm *c = flow_cuda_backend_get()->nccl_comm(boot, device);
  if (!c) return NULL;
  entry *e = malloc(sizeof *e);
  int *copy = malloc((size_t)n * sizeof *copy);
  if (!e || !copy) {
    free(e);
    free(copy);
    c->ops->free(c);
    flow_error_set("nccl: out of host memory");
    return NULL;
  }
  memcpy(copy, ranks, (size_t)n * sizeof *copy);
  pthread_mutex_lock(&cache_lock);
  *e = (entry){n, channel, copy, c, cache};
  cache = e;
  pthread_mutex_unlock(&cache_lock);
  return c;
}

void flow_nccl_finalize(void) {
  while (cache) {
    entry *e = cache;
    cache = e->next;
    e->comm->ops->free(e->comm);
    free(e->ranks);
    free(e);
  }
}
