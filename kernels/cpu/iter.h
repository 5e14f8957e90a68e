/* Strided N-d iteration for CPU kernels. Operand 0 is the output; inputs are broadcast to its
 * shape (stride 0 on broadcast axes). Adjacent axes that are contiguous for every operand are
 * merged, so the inner loop is as long as possible and, for contiguous data, a plain array loop. */
#ifndef FLOW_CPU_ITER_H
#define FLOW_CPU_ITER_H

#include <stdbool.h>
#include <stdint.h>

#include "../../core/tensor.h"

#define FLOW_ITER_MAX_OPS 4

typedef struct flow_iter {
  int nops, ndim;
  int64_t shape[FLOW_MAX_DIMS];
  int64_t stride[FLOW_ITER_MAX_OPS][FLOW_MAX_DIMS];  /* bytes, per operand, per axis */
  char *data[FLOW_ITER_MAX_OPS];
  int64_t numel;
} flow_iter;

/* The inner loop: n elements; ptr[k] advance by stride[k] bytes each. */
typedef void (*flow_iter_fn)(char **ptr, const int64_t *stride, int64_t n, void *ctx);

void flow_iter_init(flow_iter *it, flow_tensor *const *ops, int nops);
void flow_iter_run(const flow_iter *it, flow_iter_fn fn, void *ctx);
/* True when every operand's inner stride equals its element size (a dense inner loop). */
static inline bool flow_iter_dense(const int64_t *stride, const int64_t *esize, int nops) {
  for (int k = 0; k < nops; k++) if (stride[k] != esize[k]) return false;
  return true;
}

#endif
