/* The op registry and the eager dispatcher: one path for every op call. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "lazy.h"
#include "op.h"

static flow_op *registry_head;
static flow_global_dispatch_fn global_dispatch;

void flow_op_register(flow_op *op) {
  op->next = registry_head;
  registry_head = op;
}

const flow_op *flow_op_find(const char *name) {
  for (const flow_op *op = registry_head; op; op = op->next)
    if (strcmp(op->name, name) == 0) return op;
  return NULL;
}

const flow_op *flow_op_first(void) { return registry_head; }

void flow_op_set_global_dispatch(flow_global_dispatch_fn fn) { global_dispatch = fn; }

/* Logical shape for a global tensor (what autograd records; kernels only ever see shards). */
void flow_meta_from(flow_meta *m, const flow_tensor *t) {
  m->dtype = t->dtype;
  m->device = t->device;
  m->ndim = flow_tensor_lndim(t);
  memcpy(m->shape, flow_tensor_lshape(t), (size_t)m->ndim * sizeof(int64_t));
}

int flow_check_same_dtype(const flow_op *op, const flow_meta *in, int nin) {
  for (int i = 1; i < nin; i++)
    if (in[i].dtype != in[0].dtype)
      return flow_error_set("%s: dtype mismatch: input 1 is %s, input %d is %s (cast one with :to())",
                            op->name, flow_dtype_name(in[0].dtype), i + 1, flow_dtype_name(in[i].dtype));
  return 0;
}

int flow_check_float(const flow_op *op, const flow_meta *t, const char *what) {
  if (!flow_dtype_is_float(t->dtype))
    return flow_error_set("%s: %s must be a floating-point tensor (got %s)", op->name, what,
                          flow_dtype_name(t->dtype));
  return 0;
}

static int check_inputs(const flow_op *op, flow_tensor *const *in, int nin) {
  if (op->nin >= 0 && nin != op->nin)
    return flow_error_set("%s: expected %d tensor inputs, got %d", op->name, op->nin, nin);
  for (int i = 0; i < nin; i++) {
    if (!in[i]) return flow_error_set("%s: input %d is missing", op->name, i + 1);
    if (i && !flow_device_eq(in[i]->device, in[0]->device)) {
      char a[32], b[32];
      flow_device_name(in[0]->device, a, sizeof a);
      flow_device_name(in[i]->device, b, sizeof b);
      return flow_error_set("%s: inputs are on different devices (%s and %s)", op->name, a, b);
    }
  }
  return 0;
}

/* ---- the lazy seam (lazy.h) ------------------------------------------------------------------ */

static const flow_lazy_interp *lazy;
static _Thread_local bool tracing;

void flow_lazy_install(const flow_lazy_interp *li) { lazy = li; }
void flow_lazy_set_tracing(bool on) { tracing = on && lazy; }
bool flow_lazy_tracing(void) { return tracing; }
flow_tensor *flow_lazy_box(const flow_box_desc *d, flow_tensor *t) { return lazy->record_box(d, t); }

/* ---- kernels ---------------------------------------------------------------------------------
 * Every op's kernels are looked up in the kernel table at once, at first use and again after the
 * table grew (CUDA registers its kernels when flow.cuda opens). Registrations happen before ops
 * run on other threads; the lock only orders concurrent first uses. */

static pthread_mutex_t resolve_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint resolved_generation; /* the table's generation counts from 1 */

static void resolve_kernels(void) {
  unsigned gen = flow_kernel_generation();
  if (atomic_load_explicit(&resolved_generation, memory_order_acquire) == gen) return;
  pthread_mutex_lock(&resolve_lock);
  if (atomic_load_explicit(&resolved_generation, memory_order_relaxed) != gen) {
    for (flow_op *op = registry_head; op; op = op->next)
      for (int d = 0; d < FLOW_NDEVTYPES; d++) op->kernel_at[d] = flow_kernel_find((flow_devtype)d, op->name);
    atomic_store_explicit(&resolved_generation, gen, memory_order_release);
  }
  pthread_mutex_unlock(&resolve_lock);
}

bool flow_op_has_kernel(const flow_op *op, flow_devtype dev) {
  resolve_kernels();
  return op->kernel_at[dev] != NULL;
}

/* ---- float16 and bfloat16 on the CPU -----------------------------------------------------------
 * The CPU kernels compute in float32 and float64, and GEMMs also in bf16. An op given float16 or
 * bfloat16 tensors on the CPU runs its float32 kernel on float32 copies of them, and each half
 * output is rounded once from the float32 result: what PyTorch's CPU kernels do for these dtypes
 * (float32 inside, one rounding at the end). Tensors the kernel writes (outputs, an in-place
 * destination, written_in) are copied back after it. Views make no copies, and ops whose CPU
 * kernels take half tensors themselves (op->cpu_half: copies, gathers, the elementwise ops, which
 * widen them in registers for their float32 loops, sums, and matmul and attention, on oneDNN's
 * bf16 GEMM) get them as they are; such a kernel may still ask for the copies (FLOW_KERNEL_F32: a
 * float16 matmul, or bf16 on a CPU without AVX512-BF16). */

static bool staged_dtype(const flow_tensor *t) {
  return t && t->device.type == FLOW_CPU && flow_dtype_is_half(t->dtype);
}

/* t's float32 twin among the first n staged so far (from[i] -> to[i]), made (and filled from t when
 * fill) if new; NULL + error. */
static flow_tensor *twin(flow_tensor *t, bool fill, flow_tensor **from, flow_tensor **to, int *n) {
  for (int i = 0; i < *n; i++)
    if (from[i] == t) return to[i];
  flow_tensor *f = flow_tensor_new(FLOW_F32, t->device, t->ndim, t->shape);
  if (!f || (fill && flow_kernel_copy(f, t) != 0)) {
    flow_tensor_decref(f);
    return NULL;
  }
  from[*n] = t;
  to[(*n)++] = f;
  return f;
}

static int run_staged(const flow_op *op, flow_kernel_fn k, flow_tensor *const *in, int nin, const flow_attrs *a,
                      flow_tensor **out) {
  int nout = op->nout, n = 0, rc = 0;
  flow_tensor *stack[24], **from = nin + nout <= 12 ? stack : malloc(2 * (size_t)(nin + nout) * sizeof *from);
  if (!from) return flow_error_set("%s: out of memory", op->name);
  flow_tensor **to = from + nin + nout, *sin[8], *sout[8];
  flow_tensor **fin = nin <= 8 ? sin : malloc((size_t)nin * sizeof *fin), **fout = sout;   /* nout <= 8 */
  if (!fin) rc = flow_error_set("%s: out of memory", op->name);
  for (int i = 0; rc == 0 && i < nin; i++)
    if (!(fin[i] = staged_dtype(in[i]) ? twin(in[i], true, from, to, &n) : in[i])) rc = -1;
  for (int j = 0; rc == 0 && j < nout; j++)
    if (!(fout[j] = staged_dtype(out[j]) ? twin(out[j], false, from, to, &n) : out[j])) rc = -1;
  if (rc == 0) rc = k(fin, nin, fout, nout, a);
  /* back into what the kernel wrote: the outputs (an in-place op's is input 0) and written_in */
  for (int i = 0; i < n; i++) {
    bool written = false;
    for (int j = 0; j < nout; j++) written |= from[i] == out[j];
    for (int j = 0; j < nin; j++) written |= from[i] == in[j] && flow_op_writes(op, j);
    if (rc == 0 && written) rc = flow_kernel_copy(from[i], to[i]);
    flow_tensor_decref(to[i]);
  }
  if (from != stack) free(from);
  if (fin != sin) free(fin);
  return rc;
}

int flow_op_run_kernel(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a, flow_tensor **out) {
  flow_device dev = op->kind == FLOW_OP_SOURCE ? out[0]->device : in[0]->device;
  resolve_kernels();
  flow_kernel_fn k = op->kernel_at[dev.type];
  if (!k) {
    char name[32];
    flow_device_name(dev, name, sizeof name);
    return flow_error_set("%s: no kernel for device %s", op->name, name);
  }
  bool stage = false;
  if (dev.type == FLOW_CPU && op->kind != FLOW_OP_VIEW && !op->cpu_half) {
    for (int i = 0; i < nin; i++) stage |= staged_dtype(in[i]);
    for (int j = 0; j < op->nout; j++) stage |= staged_dtype(out[j]);
  }
  int rc = stage ? run_staged(op, k, in, nin, a, out) : k(in, nin, out, op->nout, a);
  if (rc == FLOW_KERNEL_F32 && dev.type == FLOW_CPU) rc = run_staged(op, k, in, nin, a, out);
  if (rc != 0) {
    const char *m = flow_error_get(); /* "[rank r] ..." came from a global op, which names its op */
    if (strncmp(m, op->name, strlen(op->name)) != 0 && strncmp(m, "[rank ", 6) != 0) flow_error_prefix("%s", op->name);
    return -1;
  }
  if (op->kind == FLOW_OP_INPLACE) in[0]->storage->version++;
  return 0;
}

/* ---- eager local --------------------------------------------------------------------------- */

int flow_op_call_local(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                       flow_tensor **out) {
  flow_meta meta[8], *im = NULL, small[8];
  int nout = op->nout;
  for (int j = 0; j < nout; j++) out[j] = NULL;
  if (nin > 0) im = nin <= 8 ? small : malloc((size_t)nin * sizeof *im);
  if (nin > 0 && !im) return flow_error_set("%s: out of memory", op->name);
  for (int i = 0; i < nin; i++) flow_meta_from(&im[i], in[i]);
  int rc = op->infer(op, im, nin, a, meta);
  if (im != small) free(im);
  if (rc != 0) return -1;
  /* Sizes from the user reach here unchecked by most rules: refuse what no tensor can hold. */
  for (int j = 0; j < nout; j++)
    if (flow_shape_check(meta[j].ndim, meta[j].shape, meta[j].dtype) != 0) return flow_error_prefix("%s", op->name);
  if (tracing) return lazy->record_op(op, in, nin, a, meta, out);
  if (op->kind == FLOW_OP_COMPUTE || op->kind == FLOW_OP_SOURCE) {
    for (int j = 0; j < nout; j++) {
      out[j] = flow_tensor_new(meta[j].dtype, meta[j].device, meta[j].ndim, meta[j].shape);
      if (!out[j]) { flow_error_prefix("%s", op->name); goto fail; }
    }
  } else if (op->kind == FLOW_OP_INPLACE) {
    out[0] = in[0];
    flow_tensor_incref(in[0]);
  }
  if (flow_op_run_kernel(op, in, nin, a, out) != 0) goto fail;
  return 0;
fail:
  for (int j = 0; j < nout; j++) {
    flow_tensor_decref(out[j]);
    out[j] = NULL;
  }
  return -1;
}

int flow_op_call(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a,
                 flow_tensor **out) {
  if (check_inputs(op, in, nin) != 0) return -1;
  for (int i = 0; i < nin && flow_grad_enabled(); i++)
    if (flow_op_writes(op, i) && in[i]->requires_grad)
      return flow_error_set("%s: in-place operation on a tensor that requires grad (use flow.no_grad "
                            "or an out-of-place op)", op->name);
  bool global = false;
  for (int i = 0; i < nin; i++) global |= in[i]->global != NULL;
  int rc;
  if (global) {
    if (!global_dispatch) return flow_error_set("%s: global tensors are not available in this build", op->name);
    bool prev = flow_grad_set_enabled(false);
    rc = global_dispatch(op, in, nin, a, out);
    flow_grad_set_enabled(prev);
  } else {
    rc = flow_op_call_local(op, in, nin, a, out);
  }
  if (rc != 0) return -1;
  if (op->grad && flow_grad_enabled() && flow_autograd_record(op, in, nin, a, out, op->nout) != 0) {
    for (int j = 0; j < op->nout; j++) { flow_tensor_decref(out[j]); out[j] = NULL; }
    return -1;
  }
  return 0;
}

flow_tensor *flow_op_call1(const flow_op *op, flow_tensor *const *in, int nin, const flow_attrs *a) {
  flow_tensor *out[8];
  if (flow_op_call(op, in, nin, a, out) != 0) return NULL;
  for (int j = 1; j < op->nout; j++) flow_tensor_decref(out[j]);
  return out[0];
}
