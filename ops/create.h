/* Creation and random ops: arange, linspace, eye, rand, randn, randint, dropout. C entry points
 * return a new reference, or NULL with the error set. */
#ifndef FLOW_OPS_CREATE_H
#define FLOW_OPS_CREATE_H

#include "../core/rng.h"
#include "op.h"

/* Source ops. Each reads attrs shape/nshape (the tensor made), dtype, device, and:
 *   arange    scalar = start, scalar2 = step          linspace  scalar = start, scalar2 = stop
 *   eye       (shape {n, m})                          rand, randn  seed, rng_offset
 *   randint   seed, rng_offset, axes[0] = low, axes[1] = high (naxes = 2)
 * and all of them honour box_start/logical_shape/nlogical (core/tensor.h): the tensor made is then
 * the box [box_start, box_start + shape) of the logical tensor, holding exactly its values. */
extern flow_op flow_op_arange, flow_op_linspace, flow_op_eye, flow_op_rand, flow_op_randn,
    flow_op_randint, flow_op_dropout;

/* The length of arange(start, stop, step): ceil((stop - start) / step); -1 + error if the bounds
 * are not finite, step is 0 or step points away from stop. */
int flow_arange_length(double start, double stop, double step, int64_t *n);
flow_tensor *flow_arange(double start, double stop, double step, flow_dtype dtype, flow_device dev);
flow_tensor *flow_linspace(double start, double stop, int64_t n, flow_dtype dtype, flow_device dev);
flow_tensor *flow_eye(int64_t n, int64_t m, flow_dtype dtype, flow_device dev);

/* Random tensors: each reserves numel counters from the generator (core/rng.h). */
flow_tensor *flow_rand(int ndim, const int64_t *shape, flow_dtype dtype, flow_device dev);
flow_tensor *flow_randn(int ndim, const int64_t *shape, flow_dtype dtype, flow_device dev);
flow_tensor *flow_randint(int64_t low, int64_t high, int ndim, const int64_t *shape, flow_dtype dtype,
                          flow_device dev);

/* One shard of a logical tensor made by a creation op: `logical` holds the attrs of the whole
 * tensor (shape = the logical shape; for random ops the seed and offset reserved once for the
 * whole tensor, flow_rng_reserve(logical numel), the same on every rank); the shard is the box
 * [box_start, box_start + box_shape). Runs the local kernel only (no autograd, no global
 * dispatch): what the global layer calls on each rank. A device without a kernel for op gets
 * the box drawn on the host and copied. */
flow_tensor *flow_create_shard(const flow_op *op, const flow_attrs *logical, const int64_t *box_start,
                               const int64_t *box_shape);

/* Inverted dropout: each element is zeroed with probability p, the rest scaled by 1 / (1 - p).
 * The mask of element i is drawn at (rng.seed, rng.offset, i), and the gradient redraws it from
 * the same state (attrs.scalar = p, seed, rng_offset; box attrs as above for shards).
 * flow_dropout reserves numel(t) counters; a global caller reserves the logical numel itself and
 * uses flow_dropout_at. p == 0 returns t itself (a new reference). */
flow_tensor *flow_dropout(flow_tensor *t, double p);
flow_tensor *flow_dropout_at(flow_tensor *t, double p, flow_rng_state rng);

#endif
