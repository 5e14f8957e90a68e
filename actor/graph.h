/* The graph IR of lazy mode (DESIGN.md section 6) and the tracer that builds it. A graph is what
 * one rank runs: every rank traces the same build function (SPMD), and the eager-global
 * interpreter has already chosen each op's SBP signature and inserted the boxings, so the nodes
 * are this rank's physical ops on shards: ops (with shard attrs), boxings (collectives or
 * send/recv), graph inputs and captured tensors (parameters, optimizer state, constants). */
#ifndef FLOW_ACTOR_GRAPH_H
#define FLOW_ACTOR_GRAPH_H

#include "../ops/lazy.h"
#include "../sbp/global.h"

enum flow_gnode_kind {
  FLOW_GNODE_INPUT,    /* graph input k, fed at each run */
  FLOW_GNODE_CAPTURE,  /* a real tensor read (and maybe written) in place: parameters, state */
  FLOW_GNODE_OP,       /* an op on shards */
  FLOW_GNODE_BOX,      /* a boxing of one shard */
  FLOW_GNODE_ACC,      /* accumulate in[1] into the captured buffer in[0] over the pieces of a run */
};

/* Micro-batches as pieces (OneFlow's unpack, repeat and acc actors): a graph traced for one
 * micro-batch runs M pieces per step. Forward nodes act per piece; backward nodes too, on their
 * own streams, so a stage's forward runs ahead of its backward as far as the credits allow; step
 * nodes (the optimizer pass) act once, after the last piece. */
enum flow_gphase { FLOW_PHASE_FORWARD, FLOW_PHASE_BACKWARD, FLOW_PHASE_STEP };

typedef struct flow_gnode {
  enum flow_gnode_kind kind;
  const flow_op *op;         /* OP */
  flow_attrs attrs;          /* OP: this rank's shard attrs */
  flow_box_desc box;         /* BOX */
  flow_tensor *captured;     /* CAPTURE: a reference held by the graph */
  int input;                 /* INPUT: its index */
  int nin, *in;              /* value ids read, in op order */
  int nout, out0;            /* values out0 .. out0 + nout - 1 */
  int nctrl, *ctrl;          /* nodes that must act before this one (readers before an in-place write) */
  int tag;                   /* optimizer group (1-based) whose lr and step feed attrs.lr / attrs.k; 0: none */
  flow_dtype autocast;       /* OP: the autocast dtype it was traced under (kernels read it per thread) */
  int phase;                 /* enum flow_gphase it was traced in */
  bool live;                 /* set by the dead-node pass */
  bool repeat;               /* BOX with pieces: its source is the same at every piece (a parameter),
                              * agreed by every rank of the boxing when traced */
} flow_gnode;

typedef struct flow_gvalue {
  int node, index;           /* producer and which of its outputs */
  flow_dtype dtype;
  flow_device device;
  int ndim;
  int64_t shape[FLOW_MAX_DIMS];   /* this rank's shard, as kernels see it */
  int alias;                 /* value whose memory this one is (views, in-place writes), or -1 */
  /* a global tensor's metadata (graph inputs and global results): placement NULL for local */
  const flow_placement *placement;
  flow_nd_sbp sbp;
  int lndim;
  int64_t lshape[FLOW_MAX_DIMS];
} flow_gvalue;

typedef struct flow_graph {
  int id;
  int nnodes, capnodes;
  flow_gnode *nodes;
  int nvalues, capvalues;
  flow_gvalue *values;
  int ninputs;
  int noutputs, *outputs;    /* value ids */
  int tag;                   /* the tag new nodes get */
  int phase;                 /* the phase new nodes get */
  int pieces;                /* micro-batches per run: inputs are unpacked along axis 0 (1: none) */
  /* random ops: the generator's counter when the trace began, and how far the trace advanced it
   * (each run reserves that many counters afresh, as an eager step would) */
  uint64_t rng_base, rng_span;
  /* activation checkpointing: nodes [first, last] traced inside a marked module's forward, and
   * the values that forward returned */
  int nsegments;
  struct flow_gsegment { int first, last, nout, *out; } *segments;
} flow_graph;

flow_graph *flow_graph_new(void);
void flow_graph_free(flow_graph *g);

/* Tracing: begin makes g the thread's current graph and turns the lazy interpreter on; end turns
 * it off. Ops called in between append nodes to g. */
int flow_graph_begin(flow_graph *g);
void flow_graph_end(flow_graph *g);

/* A lazy tensor standing for graph input `t` (same shard metadata, and t's global metadata). With
 * g->pieces = M > 1, t's shard is unpacked along axis 0 into M micro-batches, one per piece of a
 * run, and the lazy tensor is one of them (shard and logical axis 0 divided by M). */
flow_tensor *flow_graph_input(flow_graph *g, const flow_tensor *t);
/* Gradient accumulation: a lazy tensor holding the sum of t over the pieces of a run (an ACC node
 * writing a buffer the graph owns), with t's global metadata. */
flow_tensor *flow_graph_acc(flow_graph *g, const flow_tensor *t);
/* Mark lazy tensor t (of g) as the next output; its value is returned by each run. */
int flow_graph_output(flow_graph *g, const flow_tensor *t);
/* The value a lazy tensor of g stands for, or -1 + error naming `what`. */
int flow_graph_value_of(const flow_graph *g, const flow_tensor *t, const char *what);

/* Activation checkpointing: bracket the trace of a marked module's forward (end gets the values
 * it returned). */
int flow_graph_segment_begin(flow_graph *g);
int flow_graph_segment_end(flow_graph *g, int begin, flow_tensor *const *outs, int nout);
/* The recompute pass: inside each segment, a value read after the segment ends (by backward:
 * an activation saved for a gradient) is recomputed from the segment's inputs just before its
 * first such reader, so the forward's copy dies inside the segment. The segment's results stay.
 * Returns the number of nodes added. Run before pruning. */
int flow_graph_recompute(flow_graph *g);

/* The dead-node pass: nodes that reach no output and write no captured tensor are dropped
 * (their `live` flag stays false). Returns the number of live nodes. */
int flow_graph_prune(flow_graph *g);

/* Does the node move data between ranks (a boxing, or a traced local -> global conversion)? Such
 * nodes run on the collective stream. */
bool flow_gnode_communicates(const flow_gnode *n);

/* Fusion "add to output" (OneFlow's allow_fuse_add_to_output): an out-of-place add whose first
 * input dies there, read by nothing else on another stream, writes its sum into that input's
 * buffer instead of a new one (add -> add_). Returns how many adds were fused. Run after pruning. */
int flow_graph_fuse_add_to_output(flow_graph *g);

/* The value whose memory v is (follows views and in-place writes to the root). */
int flow_graph_root(const flow_graph *g, int v);

#endif
