/* oneDNN on the CPU (onednn.h): the engine, the thread rule, the bf16 check, the primitive cache
 * and the batched GEMM on oneDNN's matmul primitive. */
#include "onednn.h"

#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/autocast.h"

/* ---- the engine, threads and bf16 ------------------------------------------------------------ */

static pthread_once_t once = PTHREAD_ONCE_INIT;
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static int nthreads;        /* 0: OpenMP's own choice */
static bool bf16_native;    /* AVX512-BF16 or AMX, and not FLOW_NO_BF16 */
static bool bf16_forced_off;
static _Thread_local bool thread_ready;

static int env_int(const char *name) {
  const char *s = getenv(name);
  return s && *s ? atoi(s) : 0;
}

static void init(void) {
  if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success ||
      dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success)
    engine = NULL;
  if (env_int("FLOW_NUM_THREADS") > 0) nthreads = env_int("FLOW_NUM_THREADS");
  else if (!getenv("OMP_NUM_THREADS") && (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE"))) nthreads = 1;
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  bool has = (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16 ||
             (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
  bf16_forced_off = env_int("FLOW_NO_BF16") > 0;
  bf16_native = has && !bf16_forced_off;
}

/* The engine, with this thread's OpenMP team sized by the rule (each thread keeps its own count). */
static int ready(const char *op) {
  pthread_once(&once, init);
  if (!engine) return flow_error_set("%s: cannot create oneDNN's CPU engine", op);
  if (!thread_ready) {
    if (nthreads > 0) omp_set_num_threads(nthreads);
    /* inside a parallel region that only sets the region's own count: set it again outside */
    thread_ready = omp_get_level() == 0;
  }
  return 0;
}

int flow_onednn_num_threads(void) {
  if (ready("num_threads") != 0) return 1;
  return omp_get_max_threads();
}

bool flow_onednn_bf16_native(void) {
  pthread_once(&once, init);
  return bf16_native;
}

bool flow_onednn_bf16(void) {
  flow_dtype dt = flow_autocast_dtype();
  if (dt == FLOW_F16) {
    /* oneDNN 2.x has no float16 GEMM or convolution on the CPU; PyTorch's CPU autocast likewise
     * warns and runs float32 */
    static atomic_bool told_f16;
    if (!atomic_exchange(&told_f16, true))
      fprintf(stderr, "flowlua: float16 autocast on cpu runs in float32 (oneDNN has no float16 GEMM or "
                      "convolution on the CPU; use bfloat16)\n");
    return false;
  }
  if (dt != FLOW_BF16) return false;
  pthread_once(&once, init);
  static atomic_bool told;
  if (!bf16_native && !atomic_exchange(&told, true))
    fprintf(stderr, "flowlua: bf16 autocast on cpu runs in float32 here (%s)\n",
            bf16_forced_off ? "FLOW_NO_BF16 is set" : "this CPU has neither AVX512-BF16 nor AMX");
  return bf16_native;
}

/* ---- the primitive cache --------------------------------------------------------------------- */

/* Open addressing over CAP slots; when half full the table is emptied (shapes of a training run
 * are few; a run with ever-new shapes rebuilds rather than grows without bound). Lookup and
 * execution hold one lock, so callers on several threads (actor streams) never share a primitive
 * in flight. */
#define CAP 4096
#define MAXARGS 12

/* A primitive with the memory objects of its arguments, kept so a run only points them at data.
 * oneDNN fixes a primitive's thread count when it builds it: an entry serves only the thread count
 * it was built under (omp_get_max_threads then), so a primitive built on one thread does not go on
 * running on one after the count is raised (flow._bench.set_threads, omp_set_num_threads). */
typedef struct entry {
  flow_onednn_key key;
  int threads;
  uint64_t hash;
  dnnl_primitive_desc_t pd;
  dnnl_primitive_t prim;
  int nmem;
  dnnl_exec_arg_t mem[MAXARGS];
} entry;

static entry *table;
static int count;
static atomic_int alone_in_flight;
static int64_t built;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

void flow_onednn_key_add(flow_onednn_key *k, int64_t x) {
  if (k->n < FLOW_ONEDNN_KEY_MAX) k->v[k->n] = x;
  k->n++;
}

static uint64_t hash_key(const flow_onednn_key *k) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < k->n; i++) h = (h ^ (uint64_t)k->v[i]) * 1099511628211ull;
  return h;
}

static void clear_table(void) {
  for (int i = 0; i < CAP; i++)
    if (table[i].prim) {
      for (int j = 0; j < table[i].nmem; j++) dnnl_memory_destroy(table[i].mem[j].memory);
      dnnl_primitive_destroy(table[i].prim);
      dnnl_primitive_desc_destroy(table[i].pd);
      table[i].prim = NULL;
    }
  count = 0;
}

/* The entry for key, built on a miss; with mu held. NULL with the error set. */
static entry *lookup(const char *op, const flow_onednn_key *key, flow_onednn_build build, const void *ctx) {
  if (key->n > FLOW_ONEDNN_KEY_MAX)
    return flow_error_set("%s: oneDNN key of %d numbers (at most %d)", op, key->n, FLOW_ONEDNN_KEY_MAX), NULL;
  if (!table && !(table = calloc(CAP, sizeof *table)))
    return flow_error_set("%s: out of memory for the oneDNN cache", op), NULL;
  int threads = omp_get_max_threads();
  uint64_t h = (hash_key(key) ^ (uint64_t)threads) * 1099511628211ull;
  size_t i = h % CAP;
  for (; table[i].prim; i = (i + 1) % CAP)
    if (table[i].hash == h && table[i].threads == threads && table[i].key.n == key->n &&
        memcmp(table[i].key.v, key->v, (size_t)key->n * sizeof key->v[0]) == 0)
      return &table[i];
  if (count >= CAP / 2) {
    /* GEMMs running alone on the threads of a team (flow_onednn_run_alone) hold entries without mu */
    if (atomic_load(&alone_in_flight) > 0) {
      if (count >= CAP - CAP / 8)
        return flow_error_set("%s: %d oneDNN primitives cached while GEMMs run on several threads", op, count), NULL;
    } else {
      clear_table();
      i = h % CAP;
    }
  }
  dnnl_primitive_desc_t pd = NULL;
  dnnl_primitive_t prim = NULL;
  dnnl_status_t st = build(&pd, engine, ctx);
  if (st == dnnl_success) st = dnnl_primitive_create(&prim, pd);
  if (st != dnnl_success) {
    if (pd) dnnl_primitive_desc_destroy(pd);
    return flow_error_set("%s: oneDNN has no primitive for these shapes (status %d)", op, (int)st), NULL;
  }
  table[i] = (entry){.key = *key, .threads = threads, .hash = h, .pd = pd, .prim = prim};
  count++;
  built++;
  return &table[i];
}

/* e's memory object for argument `arg`, created on first use; NULL with the error set. */
static dnnl_memory_t memory_for(const char *op, entry *e, int arg) {
  for (int i = 0; i < e->nmem; i++)
    if (e->mem[i].arg == arg) return e->mem[i].memory;
  dnnl_memory_t m;
  const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(e->pd, dnnl_query_exec_arg_md, arg);
  if (e->nmem == MAXARGS || dnnl_memory_create(&m, md, engine, DNNL_MEMORY_NONE) != dnnl_success)
    return flow_error_set("%s: cannot wrap argument %d for oneDNN", op, arg), NULL;
  e->mem[e->nmem++] = (dnnl_exec_arg_t){arg, m};
  return m;
}

int flow_onednn_run(const char *op, const flow_onednn_key *key, flow_onednn_build build, const void *ctx,
                    int nargs, const flow_onednn_arg *args) {
  if (ready(op) != 0) return -1;
  if (nargs > MAXARGS) return flow_error_set("%s: %d oneDNN arguments (at most %d)", op, nargs, MAXARGS);
  dnnl_exec_arg_t ex[MAXARGS];
  int rc = 0;
  pthread_mutex_lock(&mu);
  entry *e = lookup(op, key, build, ctx);
  if (!e) rc = -1;
  for (int i = 0; rc == 0 && i < nargs; i++) {
    ex[i] = (dnnl_exec_arg_t){args[i].arg, memory_for(op, e, args[i].arg)};
    if (!ex[i].memory || dnnl_memory_set_data_handle(ex[i].memory, (void *)args[i].data) != dnnl_success)
      rc = ex[i].memory ? flow_error_set("%s: cannot point oneDNN at argument %d", op, args[i].arg) : -1;
  }
  if (rc == 0) {
    dnnl_status_t st = dnnl_primitive_execute(e->prim, stream, nargs, ex);
    if (st == dnnl_success) st = dnnl_stream_wait(stream);
    if (st != dnnl_success) rc = flow_error_set("%s: oneDNN execution failed (status %d)", op, (int)st);
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

/* ---- one GEMM cut among the threads ------------------------------------------------------------ */

/* Each thread's own stream, memory objects and scratchpad: a primitive built for one thread runs on
 * several at once only with state of its own on each (oneDNN's library scratchpad is shared). */
typedef struct part_state {
  dnnl_stream_t stream;
  dnnl_memory_t mem[MAXARGS];
  dnnl_memory_desc_t md[MAXARGS];
  void *pad;
  size_t pad_bytes;
  dnnl_memory_t pad_mem;
  dnnl_memory_desc_t pad_md;
} part_state;

static _Thread_local part_state part;
static pthread_key_t part_key;   /* frees a thread's state when the thread ends (OpenMP's pool may shrink) */
static pthread_once_t part_once = PTHREAD_ONCE_INIT;

static void part_free(void *v) {
  part_state *s = v;
  for (int i = 0; i < MAXARGS; i++)
    if (s->mem[i]) dnnl_memory_destroy(s->mem[i]);
  if (s->pad_mem) dnnl_memory_destroy(s->pad_mem);
  if (s->stream) dnnl_stream_destroy(s->stream);
  free(s->pad);
  memset(s, 0, sizeof *s);
}

static void part_key_make(void) { pthread_key_create(&part_key, part_free); }

static atomic_llong cut_calls, cut_nested_calls;   /* flow_onednn_cut_counts */

/* *m, a memory object described by md: kept while *saved equals md, else made anew. */
static dnnl_status_t rewrap(dnnl_memory_t *m, dnnl_memory_desc_t *saved, const dnnl_memory_desc_t *md) {
  if (*m && dnnl_memory_desc_equal(saved, md)) return dnnl_success;
  if (*m) dnnl_memory_destroy(*m);
  *m = NULL;
  dnnl_status_t st = dnnl_memory_create(m, md, engine, DNNL_MEMORY_NONE);
  if (st == dnnl_success) *saved = *md;
  return st;
}

/* Runs e on args shifted by p * step[i] bytes, on this thread alone. A dnnl status. */
static dnnl_status_t run_part(entry *e, int nargs, const flow_onednn_arg *args, const int64_t *step, int p) {
  part_state *s = &part;
  dnnl_status_t st;
  if (!s->stream) {
    pthread_once(&part_once, part_key_make);
    if ((st = dnnl_stream_create(&s->stream, engine, dnnl_stream_default_flags))) return st;
    pthread_setspecific(part_key, s);
  }
  dnnl_exec_arg_t ex[MAXARGS + 1];
  for (int i = 0; i < nargs; i++) {
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(e->pd, dnnl_query_exec_arg_md, args[i].arg);
    if ((st = rewrap(&s->mem[i], &s->md[i], md))) return st;
    if ((st = dnnl_memory_set_data_handle(s->mem[i], (char *)args[i].data + p * step[i]))) return st;
    ex[i] = (dnnl_exec_arg_t){args[i].arg, s->mem[i]};
  }
  const dnnl_memory_desc_t *pmd = dnnl_primitive_desc_query_md(e->pd, dnnl_query_scratchpad_md, 0);
  size_t bytes = pmd ? dnnl_memory_desc_get_size(pmd) : 0;
  int n = nargs;
  if (bytes) {
    if (bytes > s->pad_bytes) {
      free(s->pad);
      s->pad_bytes = 0;
      if (!(s->pad = aligned_alloc(64, (bytes + 63) / 64 * 64))) return dnnl_out_of_memory;
      s->pad_bytes = bytes;
    }
    if ((st = rewrap(&s->pad_mem, &s->pad_md, pmd)) || (st = dnnl_memory_set_data_handle(s->pad_mem, s->pad)))
      return st;
    ex[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, s->pad_mem};
  }
  if ((st = dnnl_primitive_execute(e->prim, s->stream, n, ex))) return st;
  return dnnl_stream_wait(s->stream);
}

/* The entry for key, built for one thread (where several threads each run one: run_part), with mu
 * held. */
static entry *lookup_one_thread(const char *op, const flow_onednn_key *key, flow_onednn_build build, const void *ctx) {
  int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  entry *e = lookup(op, key, build, ctx);
  omp_set_num_threads(threads);
  return e;
}

int flow_onednn_run_parts(const char *op, const flow_onednn_key *key, flow_onednn_build build, const void *ctx,
                          int nargs, const flow_onednn_arg *args, const int64_t *step, int parts) {
  if (ready(op) != 0) return -1;
  if (nargs > MAXARGS) return flow_error_set("%s: %d oneDNN arguments (at most %d)", op, nargs, MAXARGS);
  pthread_mutex_lock(&mu);
  entry *e = lookup_one_thread(op, key, build, ctx);
  int rc = e ? 0 : -1;
  if (rc == 0) {
    atomic_fetch_add(&cut_calls, 1);
    if (omp_get_level() > 0) atomic_fetch_add(&cut_nested_calls, 1);
    dnnl_status_t bad = dnnl_success;
#pragma omp parallel for num_threads(parts) schedule(static, 1)
    for (int p = 0; p < parts; p++) {
      dnnl_status_t st = run_part(e, nargs, args, step, p);
      if (st != dnnl_success) {
#pragma omp critical(flow_onednn_parts)
        bad = st;
      }
    }
    if (bad != dnnl_success) rc = flow_error_set("%s: oneDNN execution failed (status %d)", op, (int)bad);
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

int flow_onednn_run_alone(const char *op, const flow_onednn_key *key, flow_onednn_build build, const void *ctx,
                          int nargs, const flow_onednn_arg *args) {
  if (ready(op) != 0) return -1;
  if (nargs > MAXARGS) return flow_error_set("%s: %d oneDNN arguments (at most %d)", op, nargs, MAXARGS);
  pthread_mutex_lock(&mu);
  entry *e = lookup_one_thread(op, key, build, ctx);
  if (e) atomic_fetch_add(&alone_in_flight, 1);
  pthread_mutex_unlock(&mu);
  if (!e) return -1;
  static const int64_t still[MAXARGS];
  dnnl_status_t st = run_part(e, nargs, args, still, 0);
  atomic_fetch_sub(&alone_in_flight, 1);
  return st == dnnl_success ? 0 : flow_error_set("%s: oneDNN execution failed (status %d)", op, (int)st);
}

int flow_onednn_arg_md(const char *op, const flow_onednn_key *key, flow_onednn_build build, const void *ctx, int arg,
                       dnnl_memory_desc_t *md) {
  if (ready(op) != 0) return -1;
  pthread_mutex_lock(&mu);
  entry *e = lookup(op, key, build, ctx);
  if (e) *md = *dnnl_primitive_desc_query_md(e->pd, dnnl_query_exec_arg_md, arg);
  pthread_mutex_unlock(&mu);
  return e ? 0 : -1;
}

int flow_onednn_workspace_size(const char *op, const flow_onednn_key *key, flow_onednn_build build,
                               const void *ctx, size_t *bytes) {
  dnnl_memory_desc_t md;
  if (flow_onednn_arg_md(op, key, build, ctx, DNNL_ARG_WORKSPACE, &md) != 0) return -1;
  *bytes = dnnl_memory_desc_get_size(&md);
  return 0;
}

typedef struct md_pair { const dnnl_memory_desc_t *from, *to; } md_pair;

static dnnl_status_t build_md_reorder(dnnl_primitive_desc_t *pd, dnnl_engine_t eng, const void *ctx) {
  const md_pair *p = ctx;
  return dnnl_reorder_primitive_desc_create(pd, p->from, eng, p->to, eng, NULL);
}

int flow_onednn_reorder(const char *op, const flow_onednn_key *key, const dnnl_memory_desc_t *from, const void *src,
                        const dnnl_memory_desc_t *to, void *dst) {
  md_pair p = {from, to};
  flow_onednn_arg args[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
  return flow_onednn_run(op, key, build_md_reorder, &p, 2, args);
}

int64_t flow_onednn_primitives_built(void) {
  pthread_mutex_lock(&mu);
  int64_t n = built;
  pthread_mutex_unlock(&mu);
  return n;
}

void flow_onednn_cut_counts(int64_t *cut, int64_t *nested) {
  *cut = atomic_load(&cut_calls);
  *nested = atomic_load(&cut_nested_calls);
}

/* ---- GEMM operands -------------------------------------------------------------------------- */

/* A size-1 axis may carry any stride; give it the one a plain layout would, so oneDNN sees the
 * row- or column-major matrix (with a leading dimension) it has fast kernels for. */
static void tidy_strides(flow_onednn_mat *m) {
  int n = m->ndim;
  int64_t *s = m->strides, rows = m->dims[n - 2], cols = m->dims[n - 1];
  if (rows == 1 && cols == 1) s[n - 2] = s[n - 1] = 1;
  else if (rows == 1) s[n - 2] = s[n - 1] == 1 ? cols : 1;
  else if (cols == 1) s[n - 1] = s[n - 2] == 1 ? rows : 1;
  int64_t span = 1;   /* elements one batch entry covers */
  for (int d = n - 1; d >= 0; d--) {
    if (d < n - 2 && m->dims[d] == 1) s[d] = span;
    if (s[d] * m->dims[d] > span) span = s[d] * m->dims[d];
  }
}

static void key_mat(flow_onednn_key *k, const flow_onednn_mat *m) {
  for (int d = 0; d < m->ndim; d++) {
    flow_onednn_key_add(k, m->dims[d]);
    flow_onednn_key_add(k, m->strides[d]);
  }
}

/* ---- rounding to bf16 ------------------------------------------------------------------------- */

static dnnl_status_t md_of(dnnl_memory_desc_t *md, const flow_onednn_mat *m, dnnl_data_type_t dt) {
  return dnnl_memory_desc_init_by_strides(md, m->ndim, m->dims, dt, m->strides);
}

/* dst[i] = bf16(src[i]), rounded to nearest even by VCVTNE2PS2BF16, the instruction oneDNN's own
 * reorder rounds with (same bits). Runs only where the CPU has AVX512-BF16 (flow_onednn_bf16). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
static void round_line(uint16_t *dst, const float *src, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    _mm512_storeu_si512(dst + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i)));
  for (; i < n; i += 16) {
    __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(dst + i, k, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, src + i)));
  }
}

void flow_onednn_round_bf16(uint16_t *dst, const float *src, int64_t n) { round_line(dst, src, n); }

/* Lines [l0, l1) of round_mat's walk: line l starts at src + the offset of its index over dims[0 .. n-2]
 * (strides in elements), each next offset stepped from the last (no division per line: a [B, H, T, D]
 * head view of a qkv projection is B H T lines of only D elements). */
static void round_lines(uint16_t *dst, const void *src, bool bf16, const int64_t *dims, const int64_t *strides, int n,
                        int64_t len, int64_t step, int64_t l0, int64_t l1) {
  int64_t idx[DNNL_MAX_NDIMS] = {0}, off = 0, rest = l0;
  for (int d = n - 2; d >= 0; d--) {
    idx[d] = rest % dims[d];
    rest /= dims[d];
    off += idx[d] * strides[d];
  }
  const float *f = src;
  const uint16_t *h = src;
  for (int64_t l = l0; l < l1; l++) {
    uint16_t *o = dst + l * len;
    if (bf16 && step == 1) memcpy(o, h + off, (size_t)len * 2);
    else if (bf16)
      for (int64_t j = 0; j < len; j++) o[j] = h[off + j * step];
    else if (step == 1) round_line(o, f + off, len);
    else
      for (int64_t j = 0; j < len; j++) o[j] = flow_float_to_bf16(f[off + j * step]);
    for (int d = n - 2; d >= 0; d--) {
      off += strides[d];
      if (++idx[d] < dims[d]) break;
      off -= strides[d] * dims[d];
      idx[d] = 0;
    }
  }
}

/* dst (dense, row-major over m's dims) = bf16(m), m float32 (or bf16 already: a copy) with any
 * strides: axes that continue the one inside them are merged so each line rounded is as long as
 * the layout allows. */
static void round_mat(uint16_t *dst, const flow_onednn_mat *m) {
  int64_t dims[DNNL_MAX_NDIMS] = {1}, strides[DNNL_MAX_NDIMS] = {1};
  int n = 0;
  for (int d = 0; d < m->ndim; d++) {
    if (m->dims[d] == 1) continue;
    if (n > 0 && strides[n - 1] == m->strides[d] * m->dims[d]) {
      dims[n - 1] *= m->dims[d];
      strides[n - 1] = m->strides[d];
    } else {
      dims[n] = m->dims[d];
      strides[n++] = m->strides[d];
    }
  }
  n = n > 0 ? n : 1;
  int64_t len = dims[n - 1], step = strides[n - 1], lines = flow_shape_numel(n - 1, dims);
#pragma omp parallel if (lines * len >= ((int64_t)1 << 18))
  {
    int64_t t = omp_get_num_threads(), i = omp_get_thread_num();
    round_lines(dst, m->data, m->bf16, dims, strides, n, len, step, lines * i / t, lines * (i + 1) / t);
  }
}

static void swap_last(flow_onednn_mat *m) {
  int n = m->ndim;
  int64_t d = m->dims[n - 2], s = m->strides[n - 2];
  m->dims[n - 2] = m->dims[n - 1];
  m->strides[n - 2] = m->strides[n - 1];
  m->dims[n - 1] = d;
  m->strides[n - 1] = s;
}

/* A GEMM operand is row- or column-major in its last two axes; a column-major one is the transpose
 * of a row-major matrix, and the copy is made of that (one copy serves A and A^T). */
static bool column_major(const flow_onednn_mat *m) {
  int n = m->ndim;
  return n >= 2 && m->strides[n - 2] == 1 && m->strides[n - 1] != 1;
}

/* ---- the bf16 cache ---------------------------------------------------------------------------- */

/* Under bf16 autocast a training step reads each weight in its forward GEMM and again for the input's
 * gradient, each activation again for the weight's gradient, each output gradient twice, and
 * attention's q, k, v in forward and backward: rounding each once halves the rounding. A copy
 * matches on (autocast region, storage, version, data, layout): within one region of one thread a
 * storage changes only through in-place ops, which bump its version; a new region starts afresh
 * (actor registers are rewritten between steps without a bump). A copy holds its storage, so the
 * storage cannot die and come back as another under the same address; when the cache's is the last
 * reference, the copy goes, as do this thread's copies of ended regions and older versions of the
 * same view, each time a copy is added. At most CACHE_BYTES of copies, least recently used first out.
 *
 * Carrying: the optimizer step between two regions rewrites each weight; AdamW asks for the weight's
 * copy (flow_onednn_bf16_carry) and rounds the new values into it as it writes them. The copy is then
 * `carried`: it matches the weight's version after the step in the next region of its thread only
 * (the first lookup there makes it that region's own), and no copy of an ended region is dropped
 * while it waits. A write to the weight in between bumps its version, and the copy no longer matches. */
#define CACHE_SLOTS 1024
#define CACHE_BYTES ((int64_t)64 << 20)

typedef struct copy {
  flow_onednn_mat m;        /* the float32 source, row-major form; m.storage held */
  uint64_t version, region;
  const void *owner;        /* the thread that made it: see me */
  int64_t used;             /* cache clock at the last hit */
  flow_tensor *held;        /* the bf16 copy, dense row-major */
  bool carry;               /* valid from the region after `region` on (carrying, above) */
} copy;

static copy copies[CACHE_SLOTS];
static int ncopies;
static int64_t copy_bytes, copy_clock, carried;
static pthread_mutex_t copies_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local char me;   /* &me tells this thread's copies from others' */

static bool same_view(const flow_onednn_mat *a, const flow_onednn_mat *b) {
  if (a->storage != b->storage || a->data != b->data || a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->dims[d] != b->dims[d] || a->strides[d] != b->strides[d]) return false;
  return true;
}

static void drop(int i) {
  copy_bytes -= (int64_t)flow_tensor_nbytes(copies[i].held);
  flow_tensor_decref(copies[i].held);
  __atomic_fetch_sub(&copies[i].m.storage->cached, 1, __ATOMIC_RELAXED);
  flow_storage_decref(copies[i].m.storage);
  copies[i] = copies[--ncopies];
}

/* The cached copy of m (row-major form) in region r, with a new reference, or NULL. With copies_mu. */
static flow_tensor *cache_find(const flow_onednn_mat *m, uint64_t r) {
  for (int i = 0; i < ncopies; i++) {
    copy *c = &copies[i];
    if ((c->region == r || (c->carry && r > c->region)) && c->owner == &me && c->version == m->storage->version &&
        same_view(&c->m, m)) {
      carried += c->carry;
      c->region = r;
      c->carry = false;
      c->used = ++copy_clock;
      flow_tensor_incref(c->held);
      return c->held;
    }
  }
  return NULL;
}

/* Keeps h as m's copy in region r: first drops what can no longer match (dead storages, this
 * thread's other regions, older versions of m), then the least recently used until it fits. With
 * copies_mu. */
static void cache_add(const flow_onednn_mat *m, uint64_t r, flow_tensor *h) {
  int64_t bytes = (int64_t)flow_tensor_nbytes(h);
  if (bytes > CACHE_BYTES / 4) return;
  for (int i = ncopies - 1; i >= 0; i--) {
    const copy *c = &copies[i];
    if (flow_storage_users(c->m.storage) == 0 || c->version < c->m.storage->version ||   /* dead, or written since */
        (c->owner == &me && ((c->region != r && !c->carry) || same_view(&c->m, m))))
      drop(i);
  }
  while (ncopies == CACHE_SLOTS || copy_bytes + bytes > CACHE_BYTES) {
    int lru = 0;
    for (int i = 1; i < ncopies; i++)
      if (copies[i].used < copies[lru].used) lru = i;
    drop(lru);
  }
  __atomic_fetch_add(&m->storage->refcount, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&m->storage->cached, 1, __ATOMIC_RELAXED);
  flow_tensor_incref(h);
  copies[ncopies++] = (copy){*m, m->storage->version, r, &me, ++copy_clock, h, false};
  copy_bytes += bytes;
}

flow_tensor *flow_onednn_to_bf16(const char *op, const flow_onednn_mat *m, flow_onednn_mat *out) {
  flow_onednn_mat r = *m;
  bool flip = column_major(&r);
  if (flip) swap_last(&r);
  int64_t numel = flow_shape_numel(r.ndim, r.dims);
  uint64_t region = flow_autocast_region();
  flow_tensor *h = NULL;
  if (r.storage) {
    pthread_mutex_lock(&copies_mu);
    h = cache_find(&r, region);
    pthread_mutex_unlock(&copies_mu);
  }
  if (!h) {
    /* from the caching allocator: fresh pages on every call would cost more than the rounding */
    if (!(h = flow_tensor_new(FLOW_BF16, FLOW_DEVICE_CPU, 1, &numel))) return flow_error_prefix("%s", op), NULL;
    round_mat(flow_tensor_data(h), &r);
    if (r.storage) {
      pthread_mutex_lock(&copies_mu);
      cache_add(&r, region, h);
      pthread_mutex_unlock(&copies_mu);
    }
  }
  *out = (flow_onednn_mat){.ndim = r.ndim, .data = flow_tensor_data(h), .bf16 = true};
  int64_t s = 1;
  for (int d = r.ndim - 1; d >= 0; d--) {
    out->dims[d] = r.dims[d];
    out->strides[d] = s;
    s *= r.dims[d];
  }
  if (flip) swap_last(out);
  return h;
}

flow_tensor *flow_onednn_bf16_carry(const flow_tensor *p) {
  if (!p->storage || !flow_tensor_is_contiguous(p)) return NULL;
  const void *data = flow_tensor_data(p);
  int64_t numel = flow_shape_numel(p->ndim, p->shape);
  flow_tensor *h = NULL;
  pthread_mutex_lock(&copies_mu);
  for (int i = 0; i < ncopies && !h; i++) {
    copy *c = &copies[i];
    /* this thread's copy of p's current values, in p's own element order, held by the cache alone */
    if (c->owner != &me || c->m.storage != p->storage || c->m.data != data || c->version != p->storage->version ||
        flow_shape_numel(c->m.ndim, c->m.dims) != numel || __atomic_load_n(&c->held->refcount, __ATOMIC_ACQUIRE) != 1)
      continue;
    bool dense = true;
    for (int64_t d = c->m.ndim - 1, s = 1; d >= 0; s *= c->m.dims[d], d--)
      dense &= c->m.dims[d] == 1 || c->m.strides[d] == s;
    if (!dense) continue;
    c->version = p->storage->version + 1;   /* the in-place op's bump, after the kernel */
    c->region = flow_autocast_region();
    c->carry = true;
    flow_tensor_incref(h = c->held);
  }
  pthread_mutex_unlock(&copies_mu);
  return h;
}

int64_t flow_onednn_bf16_carried(void) {
  pthread_mutex_lock(&copies_mu);
  int64_t n = carried;
  pthread_mutex_unlock(&copies_mu);
  return n;
}

/* ---- GEMM ------------------------------------------------------------------------------------ */

typedef struct gemm_desc {
  const flow_onednn_mat *a, *b, *c;
  dnnl_data_type_t in;
  bool bias;
  float alpha, beta;
  bool parts;   /* built for one thread of several (run_parts, run_alone): a scratchpad of the caller's */
} gemm_desc;

static dnnl_status_t build_gemm(dnnl_primitive_desc_t *pd, dnnl_engine_t eng, const void *ctx) {
  const gemm_desc *g = ctx;
  int n = g->c->ndim;
  dnnl_memory_desc_t a, b, c, bias;
  dnnl_dims_t bdims, bstrides;   /* bias [1, ..., 1, N], dense */
  for (int d = 0; d < n; d++) {
    bdims[d] = d == n - 1 ? g->c->dims[n - 1] : 1;
    bstrides[d] = d == n - 1 ? 1 : bdims[n - 1];
  }
  dnnl_status_t st;
  if ((st = md_of(&a, g->a, g->in)) || (st = md_of(&b, g->b, g->in)) ||
      (st = md_of(&c, g->c, g->c->bf16 ? dnnl_bf16 : dnnl_f32)) ||
      (st = dnnl_memory_desc_init_by_strides(&bias, n, bdims, dnnl_f32, bstrides)))
    return st;
  dnnl_matmul_desc_t desc;
  if ((st = dnnl_matmul_desc_init(&desc, &a, &b, g->bias ? &bias : NULL, &c))) return st;
  dnnl_primitive_attr_t attr;
  if ((st = dnnl_primitive_attr_create(&attr))) return st;
  dnnl_post_ops_t po = NULL;
  if (g->parts) st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  if (!st && g->alpha != 1) st = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &g->alpha);
  if (!st && g->beta != 0 && !(st = dnnl_post_ops_create(&po)) && !(st = dnnl_post_ops_append_sum(po, g->beta)))
    st = dnnl_primitive_attr_set_post_ops(attr, po);
  if (!st) st = dnnl_primitive_desc_create(pd, &desc, attr, eng, NULL);
  if (po) dnnl_post_ops_destroy(po);
  dnnl_primitive_attr_destroy(attr);
  return st;
}

/* With K = 0 the product is zero: C = beta C + bias. */
static void gemm_empty(const flow_onednn_mat *c, const float *bias, float beta) {
  int n = c->ndim;
  int64_t rows = flow_shape_numel(n - 1, c->dims), N = c->dims[n - 1];
  for (int64_t r = 0; r < rows; r++) {
    int64_t off = 0, rest = r;
    for (int d = n - 2; d >= 0; d--) {
      off += (rest % c->dims[d]) * c->strides[d];
      rest /= c->dims[d];
    }
    float *row = (float *)c->data + off;
    for (int64_t j = 0; j < N; j++) {
      float *x = row + j * c->strides[n - 1];
      *x = (beta != 0 ? beta * *x : 0) + (bias ? bias[j] : 0);
    }
  }
}

static _Thread_local bool whole;   /* this thread's GEMMs run whole on oneDNN's threads */

bool flow_onednn_whole(bool on) {
  bool was = whole;
  whole = on;
  return was;
}

/* Into how many pieces to cut C, one per thread, each run by oneDNN's one-thread kernel. On 2
 * threads oneDNN's own cutting ran the GEMMs of the benchmark GPT step (1024 x 256 x 768, say) at
 * 1.5-1.75x their one-thread speed, two halves at 1.8-1.9x (scripts/bench/gemm_threads.lua); the
 * whole step ran 5-11% faster. Pieces may round differently from one thread's whole GEMM where the
 * cut leaves an operand strided (a transposed A cut along M, B cut along N). Cuts batch axis 0 when
 * the threads divide it, else the longer of M and N when the threads divide it into pieces of 32 or
 * more; shrinks a, b and c to the first piece and sets step[] (a, b, c, bias) to the bytes from one
 * piece to the next. 1, changing nothing, on one thread, inside a parallel region, for a GEMM under
 * 2^18 multiply-adds a thread, for a weight's gradient with M > N (below), or when nothing divides. */
static int split(flow_onednn_mat *a, flow_onednn_mat *b, flow_onednn_mat *c, int64_t *step, bool half) {
  int t = whole || omp_in_parallel() ? 1 : flow_onednn_num_threads(), n = c->ndim;
  if (t < 2) return 1;
  int64_t M = c->dims[n - 2], N = c->dims[n - 1], K = a->dims[n - 1];
  if (flow_shape_numel(n - 2, c->dims) * M * N * K < (int64_t)t << 18) return 1;
  int64_t e = half ? 2 : 4, ec = c->bf16 ? 2 : 4;   /* bytes of an element of a and b, and of c */
  bool cut_m = M % t == 0 && M / t >= 32, cut_n = N % t == 0 && N / t >= 32;
  /* a weight's gradient dY^T X with M > N: cut along M, each piece of the transposed A is strided
   * and ran on a slower kernel (0.84x oneDNN's own cutting for 1024 x 1024 x 256), and cut along K
   * (dense pieces, then the products added) it still ran 0.93x: oneDNN cuts these itself */
  if (n == 2 && column_major(a) && M > N) return 1;
  if (n > 2 && c->dims[0] % t == 0) {
    int64_t len = c->dims[0] / t;
    step[0] = a->dims[0] == 1 ? 0 : len * a->strides[0] * e;
    step[1] = b->dims[0] == 1 ? 0 : len * b->strides[0] * e;
    step[2] = len * c->strides[0] * ec;
    step[3] = 0;
    if (a->dims[0] != 1) a->dims[0] = len;
    if (b->dims[0] != 1) b->dims[0] = len;
    c->dims[0] = len;
  } else if (cut_m && (M >= N || !cut_n)) {
    int64_t len = M / t;
    step[0] = len * a->strides[n - 2] * e;
    step[1] = 0;
    step[2] = len * c->strides[n - 2] * ec;
    step[3] = 0;
    a->dims[n - 2] = c->dims[n - 2] = len;
  } else if (cut_n) {
    int64_t len = N / t;
    step[0] = 0;
    step[1] = len * b->strides[n - 1] * e;
    step[2] = len * c->strides[n - 1] * ec;
    step[3] = len * 4;
    b->dims[n - 1] = c->dims[n - 1] = len;
  } else return 1;
  return t;
}

static void gemm_key(flow_onednn_key *key, const gemm_desc *g) {
  *key = (flow_onednn_key){0};
  flow_onednn_key_add(key, 'G');
  flow_onednn_key_add(key, g->c->ndim);
  key_mat(key, g->a);
  key_mat(key, g->b);
  key_mat(key, g->c);
  flow_onednn_key_add(key, g->in == dnnl_bf16);
  flow_onednn_key_add(key, g->c->bf16);
  flow_onednn_key_add(key, g->bias);
  union { float f; uint32_t u; } al = {g->alpha}, be = {g->beta};
  flow_onednn_key_add(key, al.u);
  flow_onednn_key_add(key, be.u);
  flow_onednn_key_add(key, g->parts);
}

int flow_onednn_gemm(const char *op, const flow_onednn_mat *a0, const flow_onednn_mat *b0, const flow_onednn_mat *c0,
                     const float *bias, float alpha, float beta) {
  int n = c0->ndim;
  if (flow_shape_numel(n, c0->dims) == 0) return 0;
  if (a0->dims[n - 1] == 0) {
    gemm_empty(c0, bias, beta);
    return 0;
  }
  flow_onednn_mat a = *a0, b = *b0, c = *c0;
  tidy_strides(&a);
  tidy_strides(&b);
  tidy_strides(&c);
  bool half = a.bf16 || b.bf16 || flow_onednn_bf16();
  /* rounded copies are dense, and oneDNN runs its fast (brgemm) kernels only on dense batches: a
   * strided block of q read as is fell to a generic kernel several times slower */
  flow_tensor *held[2] = {NULL};
  flow_onednn_mat *m[2] = {&a, &b}, r;
  int rc = 0;
  for (int i = 0; rc == 0 && i < 2; i++) {
    if (!half || m[i]->bf16) continue;
    if ((held[i] = flow_onednn_to_bf16(op, m[i], &r))) *m[i] = r;
    else rc = -1;
  }
  /* inside a team of threads (attention's batch items), this thread's GEMM runs alone, beside the
   * others' */
  bool alone = omp_in_parallel() && omp_get_num_threads() > 1;
  int parts = 1;
  int64_t step[4] = {0};
  if (rc == 0 && !alone) parts = split(&a, &b, &c, step, half);
  gemm_desc g = {&a, &b, &c, half ? dnnl_bf16 : dnnl_f32, bias != NULL, alpha, beta, parts > 1 || alone};
  flow_onednn_key key;
  gemm_key(&key, &g);
  flow_onednn_arg args[4] = {{DNNL_ARG_SRC, a.data},
                             {DNNL_ARG_WEIGHTS, b.data},
                             {DNNL_ARG_DST, c.data},
                             {DNNL_ARG_BIAS, bias}};
  if (rc == 0 && alone) rc = flow_onednn_run_alone(op, &key, build_gemm, &g, bias ? 4 : 3, args);
  else if (rc == 0 && parts > 1) rc = flow_onednn_run_parts(op, &key, build_gemm, &g, bias ? 4 : 3, args, step, parts);
  else if (rc == 0) rc = flow_onednn_run(op, &key, build_gemm, &g, bias ? 4 : 3, args);
  flow_tensor_decref(held[0]);
  flow_tensor_decref(held[1]);
  return rc;
}

int flow_onednn_sgemm(const char *op, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  flow_onednn_mat a = {2, {M, K}, {ta ? 1 : lda, ta ? lda : 1}, A};
  flow_onednn_mat b = {2, {K, N}, {tb ? 1 : ldb, tb ? ldb : 1}, B};
  flow_onednn_mat c = {2, {M, N}, {ldc, 1}, C};
  return flow_onednn_gemm(op, &a, &b, &c, NULL, alpha, beta);
}
