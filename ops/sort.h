/* Ordering ops: sort, argsort and topk along one axis. New references, NULL + error on failure. */
#ifndef FLOW_OPS_SORT_H
#define FLOW_OPS_SORT_H

#include "op.h"

extern flow_op flow_op_sort, flow_op_topk;

/* Sort along axis (ascending, or descending): values and their int64 positions along the axis.
 * Stable (equal elements keep their order); NaN sorts as the largest value, as torch. indices may
 * be NULL when not wanted. 0 or -1. */
int flow_sort(flow_tensor *t, int64_t axis, bool descending, flow_tensor **values, flow_tensor **indices);
/* The k largest (or smallest) elements along axis, best first, and their positions; ties go to the
 * lower position. 0 or -1. */
int flow_topk(flow_tensor *t, int64_t k, int64_t axis, bool largest, flow_tensor **values, flow_tensor **indices);

#endif
