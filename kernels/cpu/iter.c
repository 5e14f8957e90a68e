/* Strided N-d iteration, serial or cut among threads, and the threads our CPU kernels share with
 * oneDNN (see iter.h). */
#include "iter.h"

#include <immintrin.h>
#include <omp.h>
#include <string.h>

#include "cpu.h"
#include "onednn.h"

/* The common case: every operand contiguous with the output's shape -> one flat loop. */
static bool iter_flat(flow_iter *it, flow_tensor *const *ops, int nops) {
  const flow_tensor *out = ops[0];
  for (int k = 0; k < nops; k++) {
    const flow_tensor *t = ops[k];
    if (t->ndim != out->ndim) return false;
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (t->shape[d] != out->shape[d] || (t->shape[d] != 1 && t->stride[d] != s)) return false;
      s *= t->shape[d];
    }
  }
  it->ndim = 1;
  it->shape[0] = it->numel;
  for (int k = 0; k < nops; k++) {
    it->data[k] = flow_tensor_data(ops[k]);
    it->stride[k][0] = (int64_t)flow_dtype_size(ops[k]->dtype);
  }
  return true;
}

void flow_iter_init(flow_iter *it, flow_tensor *const *ops, int nops) {
  const flow_tensor *out = ops[0];
  int nd = out->ndim;
  it->nops = nops;
  it->numel = flow_tensor_numel(out);
  if (iter_flat(it, ops, nops)) return;
  for (int k = 0; k < nops; k++) {
    const flow_tensor *t = ops[k];
    int64_t es = (int64_t)flow_dtype_size(t->dtype);
    it->data[k] = flow_tensor_data(t);
    for (int d = 0; d < nd; d++) {
      int td = d - (nd - t->ndim);
      it->stride[k][d] = (td < 0 || t->shape[td] == 1) ? 0 : t->stride[td] * es;
    }
  }
  /* merge axis d into d+1 when, for every operand, stride[d] == stride[d+1] * shape[d+1] */
  int64_t shape[FLOW_MAX_DIMS];
  int64_t stride[FLOW_ITER_MAX_OPS][FLOW_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < nd; d++) {
    if (out->shape[d] == 1) continue;
    if (n > 0) {
      bool merge = true;
      for (int k = 0; k < nops && merge; k++)
        merge = stride[k][n - 1] == it->stride[k][d] * out->shape[d];
      if (merge) {
        shape[n - 1] *= out->shape[d];
        for (int k = 0; k < nops; k++) stride[k][n - 1] = it->stride[k][d];
        continue;
      }
    }
    shape[n] = out->shape[d];
    for (int k = 0; k < nops; k++) stride[k][n] = it->stride[k][d];
    n++;
  }
  if (n == 0) { /* scalar or all-ones shape: one element */
    shape[0] = 1;
    for (int k = 0; k < nops; k++) stride[k][0] = 0;
    n = 1;
  }
  it->ndim = n;
  memcpy(it->shape, shape, sizeof shape);
  for (int k = 0; k < nops; k++) memcpy(it->stride[k], stride[k], sizeof stride[k]);
}

/* fn over the part of the iteration whose index on `axis` lies in [lo, hi) (the whole of every
 * other axis): an odometer over the outer axes, fn on each run of the inner one. */
static void iter_box(const flow_iter *it, flow_iter_fn fn, void *ctx, int axis, int64_t lo, int64_t hi) {
  if (it->numel == 0 || lo >= hi) return;
  int nd = it->ndim, nops = it->nops;
  int64_t first[FLOW_MAX_DIMS], end[FLOW_MAX_DIMS], idx[FLOW_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    first[d] = d == axis ? lo : 0;
    end[d] = d == axis ? hi : it->shape[d];
    idx[d] = first[d];
  }
  int64_t istride[FLOW_ITER_MAX_OPS];
  char *ptr[FLOW_ITER_MAX_OPS];
  for (int k = 0; k < nops; k++) istride[k] = it->stride[k][nd - 1];
  int64_t inner = end[nd - 1] - first[nd - 1];
  for (;;) {
    for (int k = 0; k < nops; k++) {
      char *p = it->data[k];
      for (int d = 0; d < nd; d++) p += idx[d] * it->stride[k][d];
      ptr[k] = p;
    }
    fn(ptr, istride, inner, ctx);
    int d = nd - 2;
    for (; d >= 0; d--) {
      if (++idx[d] < end[d]) break;
      idx[d] = first[d];
    }
    if (d < 0) return;
  }
}

void flow_iter_run(const flow_iter *it, flow_iter_fn fn, void *ctx) {
  iter_box(it, fn, ctx, 0, 0, it->shape[0]);
}

/* ---- threads -------------------------------------------------------------------------------- */

int flow_cpu_threads(int64_t work, int64_t grain) {
  if (work < 2 * grain || omp_in_parallel()) return 1;
  int64_t t = flow_onednn_num_threads();
  return (int)(work / grain < t ? work / grain : t);
}

void flow_cpu_parallel(int threads, int64_t n, int64_t align, flow_range_fn fn, void *ctx) {
  if (threads <= 1 || n <= align) {
    fn(0, n, 0, ctx);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    int64_t parts = omp_get_num_threads(), k = omp_get_thread_num();
    int64_t lo = n * k / parts / align * align, hi = k + 1 == parts ? n : n * (k + 1) / parts / align * align;
    fn(lo, hi, (int)k, ctx);
  }
}

/* The axis to cut the iteration along for t threads: the outermost one on which the output moves
 * and that has a few pieces per thread, else the longest such; -1 when none has t pieces (the
 * output is one slot, as in a full reduction). */
static int cut_axis(const flow_iter *it, int t) {
  int best = -1;
  for (int d = 0; d < it->ndim; d++) {
    if (it->stride[0][d] == 0) continue;
    if (it->shape[d] >= 4 * t && d < it->ndim - 1) return d;
    if (best < 0 || it->shape[d] > it->shape[best]) best = d;
  }
  return best >= 0 && it->shape[best] >= t ? best : -1;
}

typedef struct box_job {
  const flow_iter *it;
  flow_iter_fn fn;
  void *ctx;
  int axis;
} box_job;

static void run_box(int64_t lo, int64_t hi, int part, void *vjob) {
  const box_job *j = vjob;
  iter_box(j->it, j->fn, j->ctx, j->axis, lo, hi);
}

void flow_iter_run_parallel(const flow_iter *it, flow_iter_fn fn, void *ctx, int64_t grain) {
  int t = flow_cpu_threads(it->numel, grain);
  int axis = t > 1 ? cut_axis(it, t) : -1;
  if (axis < 0) {
    flow_iter_run(it, fn, ctx);
    return;
  }
  box_job job = {it, fn, ctx, axis};
  flow_cpu_parallel(t, it->shape[axis], axis == it->ndim - 1 ? 32 : 1, run_box, &job);
}

/* ---- float16 and bfloat16 through a float32 loop ------------------------------------------- */

#define HALF_CHUNK 256

bool flow_iter_half_init(flow_iter_half *h, flow_tensor *const *ops, int nops, flow_iter_fn fn, void *ctx) {
  bool any = false;
  *h = (flow_iter_half){fn, ctx, nops, {0}};
  for (int k = 0; k < nops; k++) any |= flow_dtype_is_half(h->dtype[k] = ops[k]->dtype);
  return any;
}

/* The dense bfloat16 loops run over a multiple of 32 first: -O2 vectorises only loops without a
 * scalar epilogue. */
FLOW_CPU_DISPATCH static void widen_bf16(uint32_t *o, const uint16_t *h, int64_t n) {
  int64_t i = 0;   /* a bfloat16 is the float32 of its bits shifted up */
  for (; i < (n & ~(int64_t)31); i++) o[i] = (uint32_t)h[i] << 16;
  for (; i < n; i++) o[i] = (uint32_t)h[i] << 16;
}

/* (not VCVTNE2PS2BF16, which the GEMMs' rounding uses: it takes float32 subnormals as 0, and a cast
 * keeps them, as torch's) */
#define RNE_BF16(x) ((x & 0x7fffffff) > 0x7f800000 ? (x >> 16) | 0x40 : (x + 0x7fff + ((x >> 16) & 1)) >> 16)
FLOW_CPU_DISPATCH static void narrow_bf16(uint16_t *o, const uint32_t *x, int64_t n) {
  int64_t i = 0;
  for (; i < (n & ~(int64_t)31); i++) o[i] = (uint16_t)RNE_BF16(x[i]);
  for (; i < n; i++) o[i] = (uint16_t)RNE_BF16(x[i]);
}
#undef RNE_BF16

/* float16 on F16C's conversions (every x86-64-v3 CPU; rounding to nearest even, as
 * flow_float_to_half) where the CPU has them, else one element at a time */
__attribute__((target("avx,f16c"))) static void widen_f16c(float *o, const uint16_t *h, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
  for (; i < n; i++) o[i] = flow_half_to_float(h[i]);
}

__attribute__((target("avx,f16c"))) static void narrow_f16c(uint16_t *o, const float *x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(o + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; i++) o[i] = flow_float_to_half(x[i]);
}

static bool f16c(void) { return __builtin_cpu_supports("f16c"); }

void flow_cpu_widen_half(float *dst, const void *src, int64_t stride, int64_t n, flow_dtype dt) {
  const char *p = src;
  if (stride == 2 && dt == FLOW_BF16) widen_bf16((uint32_t *)dst, src, n);
  else if (stride == 2 && f16c()) widen_f16c(dst, src, n);
  else if (dt == FLOW_BF16)
    for (int64_t i = 0; i < n; i++) dst[i] = flow_bf16_to_float(*(const uint16_t *)(p + i * stride));
  else
    for (int64_t i = 0; i < n; i++) dst[i] = flow_half_to_float(*(const uint16_t *)(p + i * stride));
}

void flow_cpu_narrow_half(void *dst, int64_t stride, const float *src, int64_t n, flow_dtype dt) {
  char *p = dst;
  if (stride == 2 && dt == FLOW_BF16) narrow_bf16(dst, (const uint32_t *)src, n);
  else if (stride == 2 && f16c()) narrow_f16c(dst, src, n);
  else if (dt == FLOW_BF16)
    for (int64_t i = 0; i < n; i++) *(uint16_t *)(p + i * stride) = flow_float_to_bf16(src[i]);
  else
    for (int64_t i = 0; i < n; i++) *(uint16_t *)(p + i * stride) = flow_float_to_half(src[i]);
}

void flow_iter_half_fn(char **p, const int64_t *s, int64_t n, void *vh) {
  const flow_iter_half *h = vh;
  float buf[FLOW_ITER_MAX_OPS][HALF_CHUNK];
  char *q[FLOW_ITER_MAX_OPS];
  int64_t qs[FLOW_ITER_MAX_OPS];
  for (int64_t at = 0; at < n; at += HALF_CHUNK) {
    int64_t m = n - at < HALF_CHUNK ? n - at : HALF_CHUNK;
    for (int k = 0; k < h->nops; k++) {
      char *pk = p[k] + at * s[k];
      if (!flow_dtype_is_half(h->dtype[k])) {
        q[k] = pk;
        qs[k] = s[k];
        continue;
      }
      bool once = k > 0 && s[k] == 0;
      q[k] = (char *)buf[k];
      qs[k] = once ? 0 : (int64_t)sizeof(float);
      if (k > 0) flow_cpu_widen_half(buf[k], pk, s[k], once ? 1 : m, h->dtype[k]);
    }
    h->fn(q, qs, m, h->ctx);
    if (flow_dtype_is_half(h->dtype[0])) flow_cpu_narrow_half(p[0] + at * s[0], s[0], buf[0], m, h->dtype[0]);
  }
}
