/* Autocast (AMP): the per-thread dtype float32 matmuls, convolutions and attention compute in on
 * every device. FLOW_F32 is off; outputs and master weights stay float32 either way. */
#ifndef FLOW_AUTOCAST_H
#define FLOW_AUTOCAST_H

#include "dtype.h"

flow_dtype flow_autocast_dtype(void);
flow_dtype flow_set_autocast(flow_dtype dtype);   /* returns the previous setting */

#endif
