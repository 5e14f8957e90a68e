/* The per-thread autocast setting (autocast.h). */
#include "autocast.h"

static _Thread_local flow_dtype autocast_dtype = FLOW_F32;

flow_dtype flow_autocast_dtype(void) { return autocast_dtype; }

flow_dtype flow_set_autocast(flow_dtype dtype) {
  flow_dtype prev = autocast_dtype;
  autocast_dtype = dtype;
  return prev;
}
