/* Random ops on CUDA with the CPU's numbers: element i of a draw is Philox(seed, offset + i)
 * (core/rng.h, shared with the CPU kernels), so rand, randn and dropout give the same tensors on
 * either device. Shards of a logical tensor (attrs.nlogical) and other dtypes go through the host. */
#include "common.h"

extern "C" {
#include "../../core/rng.h"
}

/* kind 0: uniform [0, 1); 1: normal (Box-Muller, as kernels/cpu/random.c). out is contiguous. */
template <typename T>
__global__ void rand_kernel(int64_t n, T *out, uint64_t seed, uint64_t offset, int kind) {
  CUDA_LOOP(i, n) {
    uint32_t w[4];
    flow_rng_words(seed, offset, (uint64_t)i, w);
    if (sizeof(T) == 8) {
      double u = flow_rng_uniform_f64(w[0], w[1]);
      out[i] = (T)(kind == 0 ? u : sqrt(-2.0 * log(1.0 - u)) * cos(2.0 * M_PI * flow_rng_uniform_f64(w[2], w[3])));
    } else {
      float u = flow_rng_uniform_f32(w[0]);
      out[i] = (T)(kind == 0 ? u : sqrtf(-2.0f * logf(1.0f - u)) * cosf(2.0f * (float)M_PI * flow_rng_uniform_f32(w[1])));
    }
  }
}

/* Inverted dropout: kept where the element's first word, as a uniform, is >= p. */
template <typename T>
__global__ void dropout_kernel(Geo g, int64_t n, T *out, const T *x, uint64_t seed, uint64_t offset,
                               uint64_t threshold, T scale) {
  CUDA_LOOP(i, n) {
    int64_t off[2];
    geo_offsets<2>(g, i, off);
    uint32_t w[4];
    flow_rng_words(seed, offset, (uint64_t)i, w);
    out[off[0]] = w[0] >= threshold ? x[off[1]] * scale : (T)0;
  }
}

static int draw(const char *name, flow_tensor *const *in, int nin, flow_tensor **out, int nout, const flow_attrs *a,
                int kind) {
  flow_tensor *o = out[0];
  int64_t n = flow_tensor_numel(o);
  if (a->nlogical != 0 || (o->dtype != FLOW_F32 && o->dtype != FLOW_F64))
    return flow_cuda_via_host(name, in, nin, out, nout, a);
  if (n == 0) return 0;
  cudaStream_t s = stream_of(o);
  if (o->dtype == FLOW_F32) rand_kernel<float><<<grid_for(n, 256), 256, 0, s>>>(n, data_of<float>(o), a->seed, a->rng_offset, kind);
  else rand_kernel<double><<<grid_for(n, 256), 256, 0, s>>>(n, data_of<double>(o), a->seed, a->rng_offset, kind);
  return launch_check("rand_kernel");
}

static FLOW_KERNEL(k_rand) { return draw("rand", in, nin, out, nout, a, 0); }
static FLOW_KERNEL(k_randn) { return draw("randn", in, nin, out, nout, a, 1); }

static FLOW_KERNEL(k_dropout) {
  flow_tensor *o = out[0];
  if (a->nlogical != 0 || (o->dtype != FLOW_F32 && o->dtype != FLOW_F64))
    return flow_cuda_via_host("dropout", in, nin, out, nout, a);
  int64_t n = flow_tensor_numel(o);
  if (n == 0) return 0;
  const flow_tensor *ops[2] = {o, in[0]};
  Geo g;
  geo_init(&g, ops, 2);
  double p = a->scalar;
  uint64_t threshold = (uint64_t)(p * 4294967296.0);
  double scale = p < 1 ? 1.0 / (1.0 - p) : 0;
  cudaStream_t s = stream_of(o);
  if (o->dtype == FLOW_F32)
    dropout_kernel<float><<<grid_for(n, 256), 256, 0, s>>>(g, n, data_of<float>(o), data_of<float>(in[0]), a->seed,
                                                          a->rng_offset, threshold, (float)scale);
  else
    dropout_kernel<double><<<grid_for(n, 256), 256, 0, s>>>(g, n, data_of<double>(o), data_of<double>(in[0]), a->seed,
                                                           a->rng_offset, threshold, scale);
  return launch_check("dropout_kernel");
}

void flow_cuda_register_random(void) {
  FLOW_KERNEL_ADD(FLOW_CUDA, rand, k_rand);
  FLOW_KERNEL_ADD(FLOW_CUDA, randn, k_randn);
  FLOW_KERNEL_ADD(FLOW_CUDA, dropout, k_dropout);
}
