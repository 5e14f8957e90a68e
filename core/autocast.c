/* The per-thread autocast setting (autocast.h). */
#include "autocast.h"

static _Thread_local flow_dtype autocast_dtype = FLOW_F32;
static _Thread_local uint64_t region;
static uint64_t regions;

flow_dtype flow_autocast_dtype(void) { return autocast_dtype; }

flow_dtype flow_set_autocast(flow_dtype dtype) {
  flow_dtype prev = autocast_dtype;
  autocast_dtype = dtype;
  region = __atomic_add_fetch(&regions, 1, __ATOMIC_RELAXED);
  return prev;
}

uint64_t flow_autocast_region(void) { return region; }
