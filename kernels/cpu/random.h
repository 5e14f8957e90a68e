/* CPU fills computed from each element's logical index: random draws (Philox, core/rng.h) and
 * arange/linspace/eye. All honour the shard attrs (box_start, logical_shape, nlogical): out is the
 * box [box_start, box_start + out->shape) of a logical tensor, and each element gets the value of
 * its logical row-major index, so a shard holds exactly its slice of the whole tensor. */
#ifndef FLOW_CPU_RANDOM_H
#define FLOW_CPU_RANDOM_H

#include "../../core/tensor.h"

/* Uniform [0, 1) from (a->seed, a->rng_offset). Float dtypes. */
int flow_cpu_rand_uniform(flow_tensor *out, const flow_attrs *a);
/* Standard normal, Box-Muller on the words of one Philox call per element. Float dtypes. */
int flow_cpu_rand_normal(flow_tensor *out, const flow_attrs *a);
/* Integers uniform in [low, high) (high > low). Any dtype. */
int flow_cpu_rand_int(flow_tensor *out, const flow_attrs *a, int64_t low, int64_t high);
/* Inverted dropout: out = x / (1 - p) where element i's uniform >= p, else 0 (p = a->scalar). */
int flow_cpu_dropout(flow_tensor *out, const flow_tensor *x, const flow_attrs *a);
/* start + step * i (start = a->scalar, step = a->scalar2; exact in int64 when both are integers). */
int flow_cpu_arange(flow_tensor *out, const flow_attrs *a);
/* n evenly spaced values from a->scalar to a->scalar2, n = the logical length. */
int flow_cpu_linspace(flow_tensor *out, const flow_attrs *a);
/* 1 on the diagonal of the logical matrix, 0 elsewhere. */
int flow_cpu_eye(flow_tensor *out, const flow_attrs *a);

#endif
