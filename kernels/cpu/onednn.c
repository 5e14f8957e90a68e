/* oneDNN on the CPU (onednn.h): the engine, the thread rule, the bf16 check, the primitive cache
 * and the batched GEMM on oneDNN's matmul primitive. */
#include "onednn.h"

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
    thread_ready = true;
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

/* A primitive with the memory objects of its arguments, kept so a run only points them at data. */
typedef struct entry {
  flow_onednn_key key;
  uint64_t hash;
  dnnl_primitive_desc_t pd;
  dnnl_primitive_t prim;
  int nmem;
  dnnl_exec_arg_t mem[MAXARGS];
} entry;

static entry *table;
static int count;
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
  uint64_t h = hash_key(key);
  size_t i = h % CAP;
  for (; table[i].prim; i = (i + 1) % CAP)
    if (table[i].hash == h && table[i].key.n == key->n &&
        memcmp(table[i].key.v, key->v, (size_t)key->n * sizeof key->v[0]) == 0)
      return &table[i];
  if (count >= CAP / 2) {
    clear_table();
    i = h % CAP;
  }
  dnnl_primitive_desc_t pd = NULL;
  dnnl_primitive_t prim = NULL;
  dnnl_status_t st = build(&pd, engine, ctx);
  if (st == dnnl_success) st = dnnl_primitive_create(&prim, pd);
  if (st != dnnl_success) {
    if (pd) dnnl_primitive_desc_destroy(pd);
    return flow_error_set("%s: oneDNN has no primitive for these shapes (status %d)", op, (int)st), NULL;
  }
  table[i] = (entry){.key = *key, .hash = h, .pd = pd, .prim = prim};
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

/* ---- bf16 copies ---------------------------------------------------------------------------- */

typedef struct reorder_desc { const flow_onednn_mat *from, *to; } reorder_desc;

static dnnl_status_t md_of(dnnl_memory_desc_t *md, const flow_onednn_mat *m, dnnl_data_type_t dt) {
  return dnnl_memory_desc_init_by_strides(md, m->ndim, m->dims, dt, m->strides);
}

static dnnl_status_t build_reorder(dnnl_primitive_desc_t *pd, dnnl_engine_t eng, const void *ctx) {
  const reorder_desc *r = ctx;
  dnnl_memory_desc_t from, to;
  dnnl_status_t st;
  if ((st = md_of(&from, r->from, dnnl_f32)) || (st = md_of(&to, r->to, dnnl_bf16))) return st;
  return dnnl_reorder_primitive_desc_create(pd, &from, eng, &to, eng, NULL);
}

flow_tensor *flow_onednn_to_bf16(const char *op, const flow_onednn_mat *m, flow_onednn_mat *out) {
  int n = m->ndim;
  *out = *m;
  /* dense, in m's orientation: a column-major matrix stays column-major so both sides stream */
  bool colmajor = n >= 2 && m->strides[n - 2] == 1 && m->strides[n - 1] != 1;
  int64_t s = 1;
  if (colmajor) {
    out->strides[n - 2] = 1;
    out->strides[n - 1] = m->dims[n - 2];
    s = m->dims[n - 2] * m->dims[n - 1];
  }
  for (int d = n - 1 - (colmajor ? 2 : 0); d >= 0; d--) {
    out->strides[d] = s;
    s *= m->dims[d];
  }
  /* from the caching allocator: fresh pages on every call would cost more than the conversion */
  flow_tensor *h = flow_tensor_new(FLOW_BF16, FLOW_DEVICE_CPU, 1, &s);
  if (!h) return NULL;
  out->data = flow_tensor_data(h);
  if (s == 0) return h;
  reorder_desc r = {m, out};
  flow_onednn_key key = {0};
  flow_onednn_key_add(&key, 'R');
  flow_onednn_key_add(&key, n);
  key_mat(&key, m);
  key_mat(&key, out);
  flow_onednn_arg args[2] = {{DNNL_ARG_FROM, m->data}, {DNNL_ARG_TO, out->data}};
  if (flow_onednn_run(op, &key, build_reorder, &r, 2, args) != 0) {
    flow_tensor_decref(h);
    return NULL;
  }
  return h;
}

/* ---- GEMM ------------------------------------------------------------------------------------ */

typedef struct gemm_desc {
  const flow_onednn_mat *a, *b, *c;
  dnnl_data_type_t in;
  bool bias;
  float alpha, beta;
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
  if ((st = md_of(&a, g->a, g->in)) || (st = md_of(&b, g->b, g->in)) || (st = md_of(&c, g->c, dnnl_f32)) ||
      (st = dnnl_memory_desc_init_by_strides(&bias, n, bdims, dnnl_f32, bstrides)))
    return st;
  dnnl_matmul_desc_t desc;
  if ((st = dnnl_matmul_desc_init(&desc, &a, &b, g->bias ? &bias : NULL, &c))) return st;
  dnnl_primitive_attr_t attr;
  if ((st = dnnl_primitive_attr_create(&attr))) return st;
  dnnl_post_ops_t po = NULL;
  if (g->alpha != 1) st = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &g->alpha);
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
  bool half = flow_onednn_bf16();
  flow_tensor *ha = NULL, *hb = NULL;
  if (half) {
    flow_onednn_mat a16, b16;
    if (!(ha = flow_onednn_to_bf16(op, &a, &a16)) || !(hb = flow_onednn_to_bf16(op, &b, &b16))) {
      flow_tensor_decref(ha);
      return -1;
    }
    a = a16;
    b = b16;
  }
  gemm_desc g = {&a, &b, &c, half ? dnnl_bf16 : dnnl_f32, bias != NULL, alpha, beta};
  flow_onednn_key key = {0};
  flow_onednn_key_add(&key, 'G');
  flow_onednn_key_add(&key, n);
  key_mat(&key, &a);
  key_mat(&key, &b);
  key_mat(&key, &c);
  flow_onednn_key_add(&key, half);
  flow_onednn_key_add(&key, bias != NULL);
  union { float f; uint32_t u; } al = {alpha}, be = {beta};
  flow_onednn_key_add(&key, al.u);
  flow_onednn_key_add(&key, be.u);
  flow_onednn_arg args[4] = {{DNNL_ARG_SRC, a.data},
                             {DNNL_ARG_WEIGHTS, b.data},
                             {DNNL_ARG_DST, c.data},
                             {DNNL_ARG_BIAS, bias}};
  int rc = flow_onednn_run(op, &key, build_gemm, &g, bias ? 4 : 3, args);
  flow_tensor_decref(ha);
  flow_tensor_decref(hb);
  return rc;
}

int flow_onednn_sgemm(const char *op, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  flow_onednn_mat a = {2, {M, K}, {ta ? 1 : lda, ta ? lda : 1}, A};
  flow_onednn_mat b = {2, {K, N}, {tb ? 1 : ldb, tb ? ldb : 1}, B};
  flow_onednn_mat c = {2, {M, N}, {ldc, 1}, C};
  return flow_onednn_gemm(op, &a, &b, &c, NULL, alpha, beta);
}
