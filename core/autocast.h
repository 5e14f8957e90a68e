/* Autocast (AMP): the per-thread dtype float32 matmuls, convolutions and attention compute in on
 * every device. FLOW_F32 is off; outputs and master weights stay float32 either way. */
#ifndef FLOW_AUTOCAST_H
#define FLOW_AUTOCAST_H

#include <stdint.h>

#include "dtype.h"

flow_dtype flow_autocast_dtype(void);
flow_dtype flow_set_autocast(flow_dtype dtype);   /* returns the previous setting */

/* This thread's autocast region: a number no other region of any thread has, new at every
 * flow_set_autocast. What a kernel keeps from one call to the next (bf16 copies of operands) is
 * valid within one region only: between regions, tensors may change without a version bump (an
 * actor register rewritten by its next step). */
uint64_t flow_autocast_region(void);

#endif
