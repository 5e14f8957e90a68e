/* The physical plan (DESIGN.md section 6.3): a graph compiled into tasks on streams (compute,
 * collective, copy), registers with register_num credits between them, and memory planned by
 * lifetime into one arena per device. Running the plan runs the actor runtime over it. */
#ifndef FLOW_ACTOR_PLAN_H
#define FLOW_ACTOR_PLAN_H

#include "graph.h"
#include "runtime.h"

/* A graph of micro-batches (pieces) puts its backward and step nodes on the _B streams: each
 * stream acts in order, piece after piece, so forward and backward need streams of their own for
 * a stage's forward of piece p+1 to run while its backward of piece p waits for the next stage. */
enum { FLOW_STREAM_COMPUTE, FLOW_STREAM_COMM, FLOW_STREAM_COPY, FLOW_STREAM_COMPUTE_B, FLOW_STREAM_COMM_B,
       FLOW_NSTREAMS };

typedef struct flow_plan_options {
  int register_num;          /* credits on every edge (default 1) */
  int buffer;                /* pieces: credits on the edges between streams (the pipeline buffer:
                              * how far a stage's forward may run ahead of its backward); default 1 */
  bool no_fusion;            /* skip the add-to-output fusion */
} flow_plan_options;

typedef struct flow_plan flow_plan;

/* Compile g (pruned here) into a plan; the plan keeps g, which must outlive it. NULL + error. */
flow_plan *flow_plan_build(flow_graph *g, const flow_plan_options *o);
void flow_plan_free(flow_plan *p);

/* The optimizer's per-step scalars: every node tagged `tag` runs with attrs.lr = lr, attrs.k = step. */
void flow_plan_set_feed(flow_plan *p, int tag, double lr, int64_t step);

/* One run: inputs[k] feeds graph input k (shapes as traced); outputs[i] receives a new tensor
 * per graph output (a copy, with the output's global metadata). A failure on any rank of the
 * graph's placement is an error on every rank, naming the rank. 0 or -1 + error. */
int flow_plan_run(flow_plan *p, flow_tensor *const *inputs, flow_tensor **outputs);

typedef struct flow_plan_memory {
  int64_t arena_bytes;       /* packed by lifetime */
  int64_t arena_bound;       /* the most bytes alive at once: no packing can beat it */
  int64_t unpacked_bytes;    /* what the same registers take without packing */
  int64_t dedicated_bytes;   /* registers outside the arena (crossing streams, outputs, several slots) */
  int64_t captured_bytes;    /* parameters, optimizer state and constants the graph reads */
  int64_t measured_peak;     /* storage high-water mark during the last run (all devices) */
} flow_plan_memory;
void flow_plan_memory_of(const flow_plan *p, flow_plan_memory *m);

/* Graphviz text of the plan (tasks coloured by stream, register_num on the edges); malloc'ed. */
char *flow_plan_dot(const flow_plan *p);
/* Tracing of acts (flow_rt_trace) and this rank's events as Chrome trace JSON objects, comma
 * separated (pid = rank); malloc'ed. */
void flow_plan_trace(flow_plan *p, bool on);
char *flow_plan_trace_events(const flow_plan *p, int rank);

int flow_plan_ntasks(const flow_plan *p, int stream);
int flow_plan_fused(const flow_plan *p);
int flow_plan_recomputed(const flow_plan *p);
int flow_plan_repeated(const flow_plan *p);  /* boxings of parameters that move data once per run */

#endif
