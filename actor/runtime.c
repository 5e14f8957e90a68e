/* The actor runtime (runtime.h): stream threads, register slots and the req/ack messages that
 * move them between actors. A stream acts its tasks in order; all else follows from the act rule.
 * Start is a command to each stream (its run generation); end of data needs no message, since
 * every stream knows npieces and stops after its last piece. One run at a time. */
#include "runtime.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/error.h"
#include "../core/tensor.h"

/* How long a stream polls its inbox before it sleeps on its condvar: a handoff between two busy
 * streams then costs a cache-line transfer instead of a futex wake-up (several µs). */
#define RT_SPIN_NS 20000

/* ---------------------------------------------------------------------------------------------
 * Data. A register's producer-side counters belong to the producer's stream thread, an edge's
 * (one consumer's view of a register) to the consumer's stream thread; only messages cross.
 * ------------------------------------------------------------------------------------------- */

enum { MSG_REQ, MSG_ACK };

/* REQ: slot ready for edge `id`. ACK: a consumer of register `id` is done with `slot`. */
typedef struct rt_msg {
  int kind, id, slot;
} rt_msg;

typedef struct rt_edge {
  int reg, task;
  int64_t ready, read; /* reqs received, pieces consumed: the next slot to read is read % register_num */
} rt_edge;

typedef struct rt_reg {
  int producer, register_num;
  int *edges, nedges;
  int64_t written, freed; /* slots handed out; slots every consumer has acked */
  int *pending;           /* per slot: consumers yet to ack it */
} rt_reg;

typedef struct rt_task {
  char *name;
  int stream;
  flow_rt_act_fn fn;
  void *ctx;
  int *in, nin;   /* edge ids, in the order of flow_rt_add_consumer */
  int *out, nout; /* register ids, in the order of flow_rt_add_register */
  int *slots;     /* nin + nout: the in_slot and out_slot arrays handed to fn */
} rt_task;

typedef struct rt_stream {
  flow_rt *rt;
  int id;
  int *tasks, ntasks;
  pthread_t thread;
  bool started;
  /* Guarded by mu: messages from other streams, whether the thread sleeps on cv, and commands. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  rt_msg *inbox, *work; /* work: the drained batch, swapped with inbox */
  int ninbox, cap;
  bool sleeping, quit;
  uint64_t gen; /* a run starts when it changes */
  int nice;     /* added to the thread's scheduling niceness when it starts (lower priority) */
  /* This run's trace events, reserved before the run. */
  flow_rt_event *ev;
  int nev, capev;
} rt_stream;

struct flow_rt {
  int nstreams;
  rt_stream *streams;
  rt_task *tasks;
  int ntasks, captasks;
  rt_reg *regs;
  int nregs, capregs;
  rt_edge *edges;
  int nedges, capedges;
  int64_t npieces;
  bool failed; /* atomic: read by every act */
  bool trace;
  pthread_mutex_t mu; /* guards err and ndone */
  pthread_cond_t done_cv;
  int ndone;
  char err[1024];
  flow_rt_event *events;
  int nevents, capevents;
};

/* Grow *p (elements of size sz) to hold at least n; 0 or -1 + error. */
static int reserve(void *p, int *cap, int n, size_t sz) {
  if (n <= *cap) return 0;
  int c = *cap ? *cap : 8;
  while (c < n) c *= 2;
  void *q = realloc(*(void **)p, (size_t)c * sz);
  if (!q) return flow_error_set("actor runtime: out of memory");
  *(void **)p = q;
  *cap = c;
  return 0;
}

static int push_int(int **a, int *n, int v) {
  int *q = realloc(*a, (size_t)(*n + 1) * sizeof **a);
  if (!q) return flow_error_set("actor runtime: out of memory");
  q[(*n)++] = v;
  *a = q;
  return 0;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------------------
 * Building the plan
 * ------------------------------------------------------------------------------------------- */

flow_rt *flow_rt_new(int nstreams) {
  if (nstreams < 1) {
    flow_error_set("actor runtime: nstreams must be at least 1 (got %d)", nstreams);
    return NULL;
  }
  flow_rt *rt = calloc(1, sizeof *rt);
  rt_stream *s = calloc((size_t)nstreams, sizeof *s);
  if (!rt || !s) {
    free(rt);
    free(s);
    flow_error_set("actor runtime: out of memory");
    return NULL;
  }
  rt->nstreams = nstreams;
  rt->streams = s;
  pthread_mutex_init(&rt->mu, NULL);
  pthread_cond_init(&rt->done_cv, NULL);
  for (int i = 0; i < nstreams; i++) {
    s[i].rt = rt;
    s[i].id = i;
    pthread_mutex_init(&s[i].mu, NULL);
    pthread_cond_init(&s[i].cv, NULL);
  }
  return rt;
}

void flow_rt_free(flow_rt *rt) {
  if (!rt) return;
  for (int i = 0; i < rt->nstreams; i++) {
    rt_stream *s = &rt->streams[i];
    if (s->started) {
      pthread_mutex_lock(&s->mu);
      s->quit = true;
      pthread_cond_signal(&s->cv);
      pthread_mutex_unlock(&s->mu);
      pthread_join(s->thread, NULL);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->tasks);
    free(s->inbox);
    free(s->work);
    free(s->ev);
  }
  for (int i = 0; i < rt->ntasks; i++) {
    free(rt->tasks[i].name);
    free(rt->tasks[i].in);
    free(rt->tasks[i].out);
    free(rt->tasks[i].slots);
  }
  for (int i = 0; i < rt->nregs; i++) {
    free(rt->regs[i].edges);
    free(rt->regs[i].pending);
  }
  pthread_mutex_destroy(&rt->mu);
  pthread_cond_destroy(&rt->done_cv);
  free(rt->streams);
  free(rt->tasks);
  free(rt->regs);
  free(rt->edges);
  free(rt->events);
  free(rt);
}

int flow_rt_add_task(flow_rt *rt, int stream, const char *name, flow_rt_act_fn fn, void *ctx) {
  if (stream < 0 || stream >= rt->nstreams)
    return flow_error_set("actor runtime: task '%s' on stream %d, but there are %d streams", name, stream,
                          rt->nstreams);
  if (!fn) return flow_error_set("actor runtime: task '%s' has no act function", name);
  if (reserve(&rt->tasks, &rt->captasks, rt->ntasks + 1, sizeof *rt->tasks)) return -1;
  char *copy = strdup(name);
  if (!copy || push_int(&rt->streams[stream].tasks, &rt->streams[stream].ntasks, rt->ntasks)) {
    free(copy);
    return flow_error_set("actor runtime: out of memory");
  }
  rt->tasks[rt->ntasks] = (rt_task){.name = copy, .stream = stream, .fn = fn, .ctx = ctx};
  return rt->ntasks++;
}

int flow_rt_add_register(flow_rt *rt, int producer, int register_num) {
  if (producer < 0 || producer >= rt->ntasks)
    return flow_error_set("actor runtime: register producer %d is not a task (%d tasks)", producer, rt->ntasks);
  if (register_num < 1)
    return flow_error_set("actor runtime: register_num of a register of '%s' must be at least 1 (got %d)",
                          rt->tasks[producer].name, register_num);
  if (reserve(&rt->regs, &rt->capregs, rt->nregs + 1, sizeof *rt->regs)) return -1;
  int *pending = calloc((size_t)register_num, sizeof *pending);
  rt_task *t = &rt->tasks[producer];
  if (!pending || push_int(&t->out, &t->nout, rt->nregs)) {
    free(pending);
    return flow_error_set("actor runtime: out of memory");
  }
  rt->regs[rt->nregs] = (rt_reg){.producer = producer, .register_num = register_num, .pending = pending};
  return rt->nregs++;
}

int flow_rt_add_consumer(flow_rt *rt, int reg, int consumer) {
  if (reg < 0 || reg >= rt->nregs)
    return flow_error_set("actor runtime: register %d does not exist (%d registers)", reg, rt->nregs);
  if (consumer < 0 || consumer >= rt->ntasks)
    return flow_error_set("actor runtime: consumer %d is not a task (%d tasks)", consumer, rt->ntasks);
  if (reserve(&rt->edges, &rt->capedges, rt->nedges + 1, sizeof *rt->edges)) return -1;
  rt_reg *r = &rt->regs[reg];
  rt_task *t = &rt->tasks[consumer];
  if (push_int(&r->edges, &r->nedges, rt->nedges)) return -1;
  if (push_int(&t->in, &t->nin, rt->nedges)) {
    r->nedges--;
    return -1;
  }
  rt->edges[rt->nedges] = (rt_edge){.reg = reg, .task = consumer};
  return rt->nedges++;
}

int flow_rt_set_nice(flow_rt *rt, int stream, int nice) {
  if (stream < 0 || stream >= rt->nstreams)
    return flow_error_set("actor runtime: stream %d does not exist (%d streams)", stream, rt->nstreams);
  if (rt->streams[stream].started)
    return flow_error_set("actor runtime: the priority of stream %d must be set before the first run", stream);
  rt->streams[stream].nice = nice;
  return 0;
}

int flow_rt_ntasks(const flow_rt *rt) { return rt->ntasks; }
const char *flow_rt_task_name(const flow_rt *rt, int task) { return rt->tasks[task].name; }
int flow_rt_task_stream(const flow_rt *rt, int task) { return rt->tasks[task].stream; }

/* ---------------------------------------------------------------------------------------------
 * Messages: to the same stream they are handled at once (the thread owns both ends, no lock);
 * to another stream they go through its inbox.
 * ------------------------------------------------------------------------------------------- */

/* Each consumer reads and acks in order, so slots come free in order: slot k+1 fully acked
 * means every consumer acked k before it. */
static void advance_freed(rt_reg *r) {
  while (r->freed < r->written && r->pending[r->freed % r->register_num] == 0) r->freed++;
}

static void handle(flow_rt *rt, rt_msg m) {
  if (m.kind == MSG_REQ) {
    rt->edges[m.id].ready++;
    return;
  }
  rt->regs[m.id].pending[m.slot]--;
  advance_freed(&rt->regs[m.id]);
}

static void post(rt_stream *from, int to, rt_msg m) {
  flow_rt *rt = from->rt;
  if (to == from->id) {
    handle(rt, m);
    return;
  }
  rt_stream *s = &rt->streams[to];
  pthread_mutex_lock(&s->mu);
  s->inbox[s->ninbox] = m;
  __atomic_store_n(&s->ninbox, s->ninbox + 1, __ATOMIC_RELEASE); /* seen by the spinning reader */
  if (s->sleeping) pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Wait for at least one message from another stream and handle the batch. */
static void wait_messages(rt_stream *s) {
  if (!__atomic_load_n(&s->ninbox, __ATOMIC_ACQUIRE))
    for (int64_t t0 = now_ns(); !__atomic_load_n(&s->ninbox, __ATOMIC_ACQUIRE) && now_ns() - t0 < RT_SPIN_NS;)
      cpu_relax();
  pthread_mutex_lock(&s->mu);
  while (s->ninbox == 0) {
    s->sleeping = true;
    pthread_cond_wait(&s->cv, &s->mu);
    s->sleeping = false;
  }
  rt_msg *batch = s->inbox;
  int n = s->ninbox;
  s->inbox = s->work;
  s->work = batch;
  s->ninbox = 0;
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < n; i++) handle(s->rt, batch[i]);
}

/* ---------------------------------------------------------------------------------------------
 * Acting
 * ------------------------------------------------------------------------------------------- */

/* The act rule: a ready slot in every consumed register, a free slot in every produced one. */
static bool can_act(const flow_rt *rt, const rt_task *t) {
  for (int i = 0; i < t->nin; i++) {
    const rt_edge *e = &rt->edges[t->in[i]];
    if (e->ready == e->read) return false;
  }
  for (int j = 0; j < t->nout; j++) {
    const rt_reg *r = &rt->regs[t->out[j]];
    if (r->written - r->freed == r->register_num) return false;
  }
  return true;
}

static void record_failure(flow_rt *rt, const rt_task *t) {
  pthread_mutex_lock(&rt->mu);
  if (!rt->err[0]) snprintf(rt->err, sizeof rt->err, "%s: %s", t->name, flow_error_get());
  __atomic_store_n(&rt->failed, true, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&rt->mu);
}

/* Act once, then hand the produced slots on and the consumed ones back. The event's end time is
 * taken before any req leaves, so a consumer's act never starts before its producer's ended. */
static void act(rt_stream *s, rt_task *t, int64_t piece) {
  flow_rt *rt = s->rt;
  int *in_slot = t->slots, *out_slot = t->slots + t->nin;
  for (int i = 0; i < t->nin; i++) {
    const rt_edge *e = &rt->edges[t->in[i]];
    in_slot[i] = (int)(e->read % rt->regs[e->reg].register_num);
  }
  for (int j = 0; j < t->nout; j++) {
    const rt_reg *r = &rt->regs[t->out[j]];
    out_slot[j] = (int)(r->written % r->register_num);
  }
  int64_t t0 = rt->trace ? now_ns() : 0;
  bool failed = __atomic_load_n(&rt->failed, __ATOMIC_SEQ_CST);
  if (t->fn(t->ctx, piece, in_slot, out_slot, failed)) record_failure(rt, t);
  if (rt->trace)
    s->ev[s->nev++] = (flow_rt_event){.task = (int)(t - rt->tasks), .stream = s->id, .piece = piece,
                                      .t0_ns = t0, .t1_ns = now_ns()};
  for (int j = 0; j < t->nout; j++) {
    int id = t->out[j];
    rt_reg *r = &rt->regs[id];
    r->pending[out_slot[j]] = r->nedges;
    r->written++;
    advance_freed(r); /* a register nobody reads is free at once */
    for (int k = 0; k < r->nedges; k++)
      post(s, rt->tasks[rt->edges[r->edges[k]].task].stream, (rt_msg){MSG_REQ, r->edges[k], 0});
  }
  for (int i = 0; i < t->nin; i++) {
    rt_edge *e = &rt->edges[t->in[i]];
    e->read++;
    post(s, rt->tasks[rt->regs[e->reg].producer].stream, (rt_msg){MSG_ACK, e->reg, in_slot[i]});
  }
}

/* One run on one stream: its tasks in order, piece after piece, each as soon as the rule allows. */
static void stream_run(rt_stream *s) {
  flow_rt *rt = s->rt;
  for (int64_t piece = 0; piece < rt->npieces; piece++)
    for (int i = 0; i < s->ntasks; i++) {
      rt_task *t = &rt->tasks[s->tasks[i]];
      while (!can_act(rt, t)) wait_messages(s);
      act(s, t, piece);
    }
}

static void *stream_main(void *arg) {
  rt_stream *s = arg;
  flow_rt *rt = s->rt;
  uint64_t seen = 0;
#ifdef SYS_gettid
  if (s->nice) { /* Linux: niceness is per thread */
    pid_t tid = (pid_t)syscall(SYS_gettid);
    setpriority(PRIO_PROCESS, (id_t)tid, getpriority(PRIO_PROCESS, (id_t)tid) + s->nice);
  }
#endif
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (s->gen == seen && !s->quit) pthread_cond_wait(&s->cv, &s->mu);
    bool quit = s->quit;
    seen = s->gen;
    pthread_mutex_unlock(&s->mu);
    if (quit) {
      flow_thread_release(); /* the tensors and blocks this thread cached go back to malloc */
      return NULL;
    }
    stream_run(s);
    pthread_mutex_lock(&rt->mu);
    if (++rt->ndone == rt->nstreams) pthread_cond_signal(&rt->done_cv);
    pthread_mutex_unlock(&rt->mu);
  }
}

/* ---------------------------------------------------------------------------------------------
 * Running
 * ------------------------------------------------------------------------------------------- */

/* The plan must not wait on itself within a piece: producer before consumer, and a stream's
 * order, together acyclic (Kahn's algorithm). Then the earliest (piece, task) not yet acted can
 * always act, so a run cannot deadlock: its inputs come from the same piece earlier in this
 * order, its free slots from consumers of earlier pieces. */
static int check_order(const flow_rt *rt) {
  int n = rt->ntasks, *indeg = calloc((size_t)n + 1, sizeof *indeg), *next = malloc(((size_t)n + 1) * sizeof *next);
  int *queue = malloc(((size_t)n + 1) * sizeof *queue);
  if (!indeg || !next || !queue) {
    free(indeg);
    free(next);
    free(queue);
    return flow_error_set("actor runtime: out of memory");
  }
  for (int i = 0; i < n; i++) next[i] = -1;
  for (int s = 0; s < rt->nstreams; s++)
    for (int i = 0; i + 1 < rt->streams[s].ntasks; i++) {
      next[rt->streams[s].tasks[i]] = rt->streams[s].tasks[i + 1];
      indeg[rt->streams[s].tasks[i + 1]]++;
    }
  for (int e = 0; e < rt->nedges; e++) indeg[rt->edges[e].task]++;
  int head = 0, tail = 0;
  for (int i = 0; i < n; i++)
    if (!indeg[i]) queue[tail++] = i;
  while (head < tail) {
    const rt_task *t = &rt->tasks[queue[head]];
    if (next[queue[head]] >= 0 && !--indeg[next[queue[head]]]) queue[tail++] = next[queue[head]];
    head++;
    for (int j = 0; j < t->nout; j++) {
      const rt_reg *r = &rt->regs[t->out[j]];
      for (int k = 0; k < r->nedges; k++)
        if (!--indeg[rt->edges[r->edges[k]].task]) queue[tail++] = rt->edges[r->edges[k]].task;
    }
  }
  int stuck = -1;
  for (int i = 0; i < n && stuck < 0; i++)
    if (indeg[i]) stuck = i;
  free(indeg);
  free(next);
  free(queue);
  if (stuck >= 0)
    return flow_error_set("actor runtime: task '%s' waits on itself: a register it needs is produced after it "
                          "in stream order (tasks must be added in a topological order)",
                          rt->tasks[stuck].name);
  return 0;
}

/* Room for `cap` inbox messages and, when tracing, for this run's events. */
static int prepare_stream(rt_stream *s, int cap, int64_t npieces) {
  s->ninbox = 0;
  s->nev = 0;
  if (cap > s->cap) {
    rt_msg *a = realloc(s->inbox, (size_t)cap * sizeof *a);
    if (!a) return flow_error_set("actor runtime: out of memory");
    s->inbox = a;
    rt_msg *b = realloc(s->work, (size_t)cap * sizeof *b);
    if (!b) return flow_error_set("actor runtime: out of memory");
    s->work = b;
    s->cap = cap;
  }
  if (!s->rt->trace) return 0;
  if (npieces * s->ntasks > (int64_t)1 << 30)
    return flow_error_set("actor runtime: too many events to trace (%lld pieces)", (long long)npieces);
  return reserve(&s->ev, &s->capev, (int)(npieces * s->ntasks), sizeof *s->ev);
}

/* Fresh counters and buffers for a run, while every thread is idle. An inbox holds at most
 * register_num reqs per edge into the stream and register_num acks per edge out of it. */
static int prepare(flow_rt *rt, int64_t npieces) {
  int *cap = calloc((size_t)rt->nstreams, sizeof *cap);
  if (!cap) return flow_error_set("actor runtime: out of memory");
  for (int e = 0; e < rt->nedges; e++) {
    rt_edge *ed = &rt->edges[e];
    ed->ready = ed->read = 0;
    const rt_reg *r = &rt->regs[ed->reg];
    int cs = rt->tasks[ed->task].stream, ps = rt->tasks[r->producer].stream;
    if (cs != ps) {
      cap[cs] += r->register_num;
      cap[ps] += r->register_num;
    }
  }
  for (int i = 0; i < rt->nregs; i++) {
    rt_reg *r = &rt->regs[i];
    r->written = r->freed = 0;
    memset(r->pending, 0, (size_t)r->register_num * sizeof *r->pending);
  }
  int rc = 0;
  for (int i = 0; i < rt->ntasks && !rc; i++) {
    rt_task *t = &rt->tasks[i];
    int *slots = realloc(t->slots, ((size_t)t->nin + t->nout + 1) * sizeof *slots);
    if (slots) t->slots = slots;
    else rc = flow_error_set("actor runtime: out of memory");
  }
  for (int i = 0; i < rt->nstreams && !rc; i++) rc = prepare_stream(&rt->streams[i], cap[i], npieces);
  free(cap);
  rt->npieces = npieces;
  rt->failed = false;
  rt->err[0] = '\0';
  rt->ndone = 0;
  for (int i = 0; i < rt->nstreams; i++) rt->ndone += rt->streams[i].ntasks == 0;
  return rc;
}

static int start_threads(flow_rt *rt) {
  for (int i = 0; i < rt->nstreams; i++) {
    rt_stream *s = &rt->streams[i];
    if (s->started || s->ntasks == 0) continue; /* a stream without tasks needs no thread */
    if (pthread_create(&s->thread, NULL, stream_main, s))
      return flow_error_set("actor runtime: cannot start the thread of stream %d", i);
    s->started = true;
  }
  return 0;
}

static int by_start(const void *a, const void *b) {
  const flow_rt_event *x = a, *y = b;
  if (x->t0_ns != y->t0_ns) return x->t0_ns < y->t0_ns ? -1 : 1;
  return x->stream - y->stream;
}

/* The streams' events of this run, appended to the runtime's and sorted by start time. */
static int merge_events(flow_rt *rt) {
  int n = rt->nevents;
  for (int i = 0; i < rt->nstreams; i++) n += rt->streams[i].nev;
  if (reserve(&rt->events, &rt->capevents, n, sizeof *rt->events)) return -1;
  for (int i = 0; i < rt->nstreams; i++) {
    if (rt->streams[i].nev)
      memcpy(rt->events + rt->nevents, rt->streams[i].ev, (size_t)rt->streams[i].nev * sizeof *rt->events);
    rt->nevents += rt->streams[i].nev;
  }
  qsort(rt->events, (size_t)rt->nevents, sizeof *rt->events, by_start);
  return 0;
}

int flow_rt_run(flow_rt *rt, int64_t npieces) {
  if (npieces < 0) return flow_error_set("actor runtime: npieces must be >= 0 (got %lld)", (long long)npieces);
  if (check_order(rt) || prepare(rt, npieces) || start_threads(rt)) return -1;
  for (int i = 0; i < rt->nstreams; i++) {
    rt_stream *s = &rt->streams[i];
    if (s->ntasks == 0) continue;
    pthread_mutex_lock(&s->mu);
    s->gen++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
  }
  pthread_mutex_lock(&rt->mu);
  while (rt->ndone < rt->nstreams) pthread_cond_wait(&rt->done_cv, &rt->mu);
  pthread_mutex_unlock(&rt->mu);
  if (rt->trace && merge_events(rt)) return -1;
  if (rt->failed) return flow_error_set("%s", rt->err);
  return 0;
}

void flow_rt_trace(flow_rt *rt, bool on) {
  if (on) rt->nevents = 0;
  rt->trace = on;
}

int flow_rt_events(const flow_rt *rt, const flow_rt_event **ev) {
  *ev = rt->events;
  return rt->nevents;
}
