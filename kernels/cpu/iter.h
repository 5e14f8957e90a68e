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
/* The same on several threads (flow_cpu_parallel below) when it->numel >= 2 grains: the
 * iteration is cut along one axis on which the output (operand 0) moves, so no two threads write
 * one element and each output element sees the same inputs in the same order as on one thread
 * (the results are bit-identical); cuts along the inner axis fall on multiples of 32 elements, so
 * every element also takes the same (vector or scalar) path. Only for fn that writes nothing but
 * operand 0. */
void flow_iter_run_parallel(const flow_iter *it, flow_iter_fn fn, void *ctx, int64_t grain);

/* ---- float16 and bfloat16 through a float32 loop ------------------------------------------- */

/* An elementwise kernel's float32 loop run on float16/bfloat16 operands: each run in chunks of
 * 256 elements, the half inputs widened into float32 buffers on the stack (a broadcast one, stride
 * 0, once) and a half output (operand 0) computed into one and rounded back, so the loop sees
 * float32 with unit strides there. Each element gets the loop's float32 value on the widened
 * inputs, rounded once: what ops/dispatch.c's staging gives, without its copies of whole tensors.
 * Operands of other dtypes pass through as they are. */
typedef struct flow_iter_half {
  flow_iter_fn fn;
  void *ctx;
  int nops;
  flow_dtype dtype[FLOW_ITER_MAX_OPS];
} flow_iter_half;

/* Sets h up for fn (with ctx) over ops; true when any of them is float16/bfloat16 (then run
 * flow_iter_half_fn with h as its context), false when fn can run as it is. */
bool flow_iter_half_init(flow_iter_half *h, flow_tensor *const *ops, int nops, flow_iter_fn fn, void *ctx);
void flow_iter_half_fn(char **p, const int64_t *s, int64_t n, void *h);

/* n float16/bfloat16 (dt) elements at src, stride bytes apart, into dense float32 at dst; and n dense
 * float32 into dst, rounded to nearest even (flow_float_to_bf16's and flow_float_to_half's bits,
 * NaN aside), stride bytes apart. Vector loops for dense halves. */
void flow_cpu_widen_half(float *dst, const void *src, int64_t stride, int64_t n, flow_dtype dt);
void flow_cpu_narrow_half(void *dst, int64_t stride, const float *src, int64_t n, flow_dtype dt);

/* ---- threads ------------------------------------------------------------------------------ */

/* Our own kernels run on OpenMP with the thread count oneDNN uses (kernels/cpu/onednn.h:
 * FLOW_NUM_THREADS, OMP_NUM_THREADS, 1 per rank under mpirun), so GEMMs and loops share libgomp's
 * one pool of threads and never oversubscribe the cores. A loop goes parallel only when it has
 * at least two grains of work, a grain being some 10-50 us on one core: starting a parallel
 * region costs a few microseconds on an idle machine and tens where the cores are shared, so
 * a small op pays nothing and a large one gains. Cheap per element (a copy, an add: ~0.1 ns in
 * cache, 0.2-0.5 ns from memory, where a transformer's activations are: a 1 MB residual add took
 * 60 us on one thread) and costly (exp, erf, pow, a row of softmax: 0.5-2 ns). */
#define FLOW_GRAIN_CHEAP (int64_t)65536
#define FLOW_GRAIN_COSTLY (int64_t)32768

/* The threads to run `work` elements on: 1 below two grains or inside a parallel region, else up
 * to the pool's size, each with at least one grain. */
int flow_cpu_threads(int64_t work, int64_t grain);

/* fn(lo, hi, part, ctx) over [0, n) cut into contiguous ranges, one per thread of a team of at
 * most `threads` (part: 0 .. threads-1, for per-thread scratch); the cuts are multiples of
 * `align` (but n itself). threads <= 1: one call fn(0, n, 0, ctx) on this thread, no OpenMP. The
 * cuts may depend on the thread count, so fn must give the same bits however [0, n) is cut. */
typedef void (*flow_range_fn)(int64_t lo, int64_t hi, int part, void *ctx);
void flow_cpu_parallel(int threads, int64_t n, int64_t align, flow_range_fn fn, void *ctx);
/* True when every operand's inner stride equals its element size (a dense inner loop). */
static inline bool flow_iter_dense(const int64_t *stride, const int64_t *esize, int nops) {
  for (int k = 0; k < nops; k++) if (stride[k] != esize[k]) return false;
  return true;
}

#endif
