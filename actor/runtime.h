/* The actor runtime (DESIGN.md section 6.4): one actor per task, a thread per stream, registers
 * with register_num credits. An actor acts when every register it consumes has a ready slot AND
 * every register it produces has a free slot; after acting it sends "ready" (req) to the
 * consumers and "free" (ack) back to the producers. Overlap, pipelining and back-pressure follow
 * from that rule alone. The runtime knows nothing of ops or tensors: a task is a callback, a
 * register is a ring of register_num slots whose contents the plan (plan.c) owns. */
#ifndef FLOW_ACTOR_RUNTIME_H
#define FLOW_ACTOR_RUNTIME_H

#include <stdbool.h>
#include <stdint.h>

typedef struct flow_rt flow_rt;

/* What an actor does when it acts, for piece `piece` (0-based within a run). in_slot[i] is the
 * slot of the i-th register it consumes, out_slot[j] the slot of the j-th it produces. `failed`
 * is true once any actor of this run has failed: compute tasks then skip their work, while
 * communication tasks still take part so that other ranks' collectives complete (an error ends
 * the run on every rank instead of hanging it). Returns 0, or -1 with flow_error_set. */
typedef int (*flow_rt_act_fn)(void *ctx, int64_t piece, const int *in_slot, const int *out_slot, bool failed);

/* A runtime with nstreams streams (a worker thread each, started at the first run). */
flow_rt *flow_rt_new(int nstreams);
void flow_rt_free(flow_rt *rt);  /* joins the threads; NULL is fine */

/* A task on `stream`; returns its id (0, 1, ...) or -1 + error. A stream acts its tasks in the
 * order they were added, piece after piece (a stream is in order, like a CUDA stream: the plan
 * adds tasks in a topological order, so every rank issues its collectives in the same order). */
int flow_rt_add_task(flow_rt *rt, int stream, const char *name, flow_rt_act_fn fn, void *ctx);
/* A register produced by task `producer` with register_num slots; returns its id or -1. The
 * producer's j-th produced register is the j-th one added for it. */
int flow_rt_add_register(flow_rt *rt, int producer, int register_num);
/* Task `consumer` reads register `reg` (its i-th consumed register is the i-th one added). */
int flow_rt_add_consumer(flow_rt *rt, int reg, int consumer);

/* Run npieces pieces through the plan: source tasks (no consumed registers) act npieces times,
 * every task acts once per piece. Blocks until every actor has acted npieces times (end of data),
 * then returns 0, or -1 with the first failure's message ("<task name>: <error>"). The runtime can
 * run again afterwards, also after a failure. */
int flow_rt_run(flow_rt *rt, int64_t npieces);

/* Tracing: while on, every act is recorded (task, piece, stream, start and end in ns of
 * CLOCK_MONOTONIC). Events accumulate over runs until flow_rt_trace(rt, true) starts afresh. */
typedef struct flow_rt_event {
  int task, stream;
  int64_t piece;
  int64_t t0_ns, t1_ns;
} flow_rt_event;
void flow_rt_trace(flow_rt *rt, bool on);
int flow_rt_events(const flow_rt *rt, const flow_rt_event **ev);  /* count; *ev valid until the next run */

/* A lower scheduling priority for a stream's thread (niceness + nice, Linux), for streams that
 * share cores: when both could act, the other stream's thread goes first. Before the first run. */
int flow_rt_set_nice(flow_rt *rt, int stream, int nice);

int flow_rt_ntasks(const flow_rt *rt);
const char *flow_rt_task_name(const flow_rt *rt, int task);
int flow_rt_task_stream(const flow_rt *rt, int task);

#endif
