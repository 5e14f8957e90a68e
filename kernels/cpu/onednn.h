/* oneDNN on the CPU: the engine and its threads, the bf16 check, a cache of primitives keyed by
 * shape (a training step creates none after its first), and the GEMM every float32 matmul uses. */
#ifndef FLOW_CPU_ONEDNN_H
#define FLOW_CPU_ONEDNN_H

#include <dnnl.h>

#include "cpu.h"

/* Threads. oneDNN runs on OpenMP. The count each calling thread uses: FLOW_NUM_THREADS when set;
 * else OMP_NUM_THREADS when set (OpenMP reads it); else 1 under mpirun (one rank per core, no
 * oversubscription); else OpenMP's default (every core). */
int flow_onednn_num_threads(void);

/* Whether GEMMs and convolutions on float32 CPU tensors run in bf16 now: autocast asks for bf16
 * and the CPU has AVX512-BF16 or AMX (oneDNN's own cpuid check), and FLOW_NO_BF16 is not set.
 * When autocast asks and the CPU cannot, a message says so once and float32 runs instead; float16
 * autocast always runs float32 on the CPU, with one message. */
bool flow_onednn_bf16(void);
/* Whether this CPU runs bf16 natively (and FLOW_NO_BF16 is unset), autocast or not. */
bool flow_onednn_bf16_native(void);

/* ---- cached primitives ---------------------------------------------------------------------- */

/* A primitive's identity: every number its descriptor was built from. */
#define FLOW_ONEDNN_KEY_MAX 96
typedef struct flow_onednn_key {
  int n;
  int64_t v[FLOW_ONEDNN_KEY_MAX];
} flow_onednn_key;
void flow_onednn_key_add(flow_onednn_key *k, int64_t x);

/* Builds the primitive descriptor for a key (on a miss): a dnnl status. */
typedef dnnl_status_t (*flow_onednn_build)(dnnl_primitive_desc_t *pd, dnnl_engine_t engine, const void *ctx);

/* One argument of an execution: the DNNL_ARG_* slot and the data, laid out as the descriptor says. */
typedef struct flow_onednn_arg {
  int arg;
  const void *data;
} flow_onednn_arg;

/* Runs the primitive cached under key (built by build(ctx) on first use) on args. `op` names the
 * caller in errors. 0, or -1 with the error set. */
int flow_onednn_run(const char *op, const flow_onednn_key *key, flow_onednn_build build, const void *ctx,
                    int nargs, const flow_onednn_arg *args);
/* The same on `parts` pieces at once, one per OpenMP thread: piece p reads and writes args[i].data +
 * p * step[i] bytes. The primitive is built for one thread, with a scratchpad of each thread's own
 * (build must ask for dnnl_scratchpad_mode_user). */
int flow_onednn_run_parts(const char *op, const flow_onednn_key *key, flow_onednn_build build, const void *ctx,
                          int nargs, const flow_onednn_arg *args, const int64_t *step, int parts);
/* The same on this thread alone, inside a parallel region whose other threads may run GEMMs of their
 * own at the same time (build as for flow_onednn_run_parts). */
int flow_onednn_run_alone(const char *op, const flow_onednn_key *key, flow_onednn_build build, const void *ctx,
                          int nargs, const flow_onednn_arg *args);
/* Bytes of the workspace (max pooling's argmax) the primitive under key needs: built if missing. */
int flow_onednn_workspace_size(const char *op, const flow_onednn_key *key, flow_onednn_build build,
                               const void *ctx, size_t *bytes);
/* The memory descriptor the primitive under key (built if missing) takes for argument arg (a DNNL_ARG_*):
 * the layout it chose where it was built with "any". */
int flow_onednn_arg_md(const char *op, const flow_onednn_key *key, flow_onednn_build build, const void *ctx, int arg,
                       dnnl_memory_desc_t *md);
/* dst (laid out as `to`) = src (laid out as `from`), converting the data type too; the reorder is cached
 * under key, which the caller makes unique to the pair of layouts. */
int flow_onednn_reorder(const char *op, const flow_onednn_key *key, const dnnl_memory_desc_t *from, const void *src,
                        const dnnl_memory_desc_t *to, void *dst);
/* Primitives built so far (a step that builds none leaves it unchanged). */
int64_t flow_onednn_primitives_built(void);
/* GEMMs cut into pieces so far (flow_onednn_run_parts), and how many of them inside a parallel
 * region (each such one opened a nested team: libgomp started new threads for it). */
void flow_onednn_cut_counts(int64_t *cut, int64_t *nested);

/* ---- GEMM ----------------------------------------------------------------------------------- */

/* An operand of a batched GEMM: logical dims [batch..., rows, cols] (a batch dim of 1 broadcasts)
 * with element strides; a transpose is only a swap of the last two strides. float32, or bfloat16
 * already rounded when bf16. storage is the tensor storage data lies in, so that under bf16
 * autocast one rounded copy serves every GEMM of the autocast region that reads the same values
 * (the storage's version tells when they changed); NULL for temporaries and scratch, rounded
 * afresh each time. */
typedef struct flow_onednn_mat {
  int ndim;
  dnnl_dims_t dims, strides;   /* int64_t[DNNL_MAX_NDIMS] */
  const void *data;
  bool bf16;
  flow_storage *storage;
} flow_onednn_mat;

/* C[b] = alpha A[b] B[b] + bias + beta C[b] for every batch index b of C: A [.., M, K], B [.., K, N],
 * C [.., M, N] float32 (or bf16, rounded once from the float32 sums, when c->bf16) with the
 * broadcast batch shape (A, B and C share ndim; C's data is written), bias [N] dense float32 or
 * NULL. Under bf16 autocast, or when A or B is bf16 already, both are rounded to bf16 (through the
 * bf16 cache) and the products accumulate in float32. `op` names the caller in errors. A bf16 C
 * needs K > 0. */
int flow_onednn_gemm(const char *op, const flow_onednn_mat *a, const flow_onednn_mat *b, const flow_onednn_mat *c,
                     const float *bias, float alpha, float beta);

/* A bf16 copy of the float32 m (rounded to nearest even, as oneDNN's reorder rounds; m bf16 already:
 * copied as it is): dense in m's
 * orientation, described by *out (out->bf16 set), held by the tensor returned, which the caller
 * releases (flow_tensor_decref) after its last read. When m names its storage the copy comes
 * from, or goes into, the bf16 cache: the same values in the same autocast region of this thread
 * are rounded once. NULL with the error set. */
flow_tensor *flow_onednn_to_bf16(const char *op, const flow_onednn_mat *m, flow_onednn_mat *out);
/* dst[i] = bf16(src[i]) for i < n, rounded as flow_onednn_to_bf16 rounds; only where
 * flow_onednn_bf16() holds (the CPU has AVX512-BF16). */
void flow_onednn_round_bf16(uint16_t *dst, const float *src, int64_t n);
/* For an optimizer about to rewrite parameter p in place (one kernel, then the op's version bump):
 * this thread's bf16 copy of p, for the caller to fill with the new values rounded by
 * flow_onednn_round_bf16; the next autocast region's GEMMs then read it as p's copy (onednn.c: the
 * bf16 cache, carrying). NULL (fill nothing) when no GEMM of this thread's last region rounded p
 * whole, or the copy is in use. A new reference. */
flow_tensor *flow_onednn_bf16_carry(const flow_tensor *p);
/* Carried copies read so far by a GEMM (benchmarks and specs: _bench.onednn().carried). */
int64_t flow_onednn_bf16_carried(void);

/* GEMMs on several threads are cut into one piece per thread, each on oneDNN's one-thread kernel
 * (faster here than oneDNN's own cutting); flow_onednn_whole(true) makes this thread's GEMMs run
 * whole on oneDNN's threads instead (the reference in benchmarks). Returns the previous setting. */
bool flow_onednn_whole(bool on);

/* The BLAS-style form of the same GEMM, for kernels working on one matrix at a time:
 * C [M, N] (leading dimension ldc) = alpha op(A) op(B) + beta C, A and B row-major with leading
 * dimensions lda, ldb, op transposing when ta / tb. */
int flow_onednn_sgemm(const char *op, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

#endif
