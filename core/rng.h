/* The counter-based random number generator: Philox4x32-10 (Salmon et al., "Parallel random
 * numbers: as easy as 1, 2, 3", SC'11). Element i of a random tensor is a pure function of
 * (seed, offset, i), so any shard, device or thread can draw its slice without the others. */
#ifndef FLOW_RNG_H
#define FLOW_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define FLOW_RNG_FN static inline __host__ __device__
#else
#define FLOW_RNG_FN static inline
#endif

/* Ten rounds of the Philox S-box on a 128-bit counter under a 64-bit key (the key is bumped by
 * the Weyl constants between rounds). */
FLOW_RNG_FN void flow_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c0 = n0; c1 = (uint32_t)p1; c2 = n2; c3 = (uint32_t)p0;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* The four words for logical element i of a tensor drawn at (seed, offset): counter = offset + i
 * in the low 64 bits, key = seed. */
FLOW_RNG_FN void flow_rng_words(uint64_t seed, uint64_t offset, uint64_t i, uint32_t out[4]) {
  uint64_t c = offset + i;
  uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0, 0};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  flow_philox4x32_10(ctr, key, out);
}

/* Uniform [0, 1): the top 24 bits of one word (float32), the top 53 bits of two words (float64). */
FLOW_RNG_FN float flow_rng_uniform_f32(uint32_t w) { return (float)(w >> 8) * (1.0f / 16777216.0f); }
FLOW_RNG_FN double flow_rng_uniform_f64(uint32_t lo, uint32_t hi) {
  return (double)((((uint64_t)hi << 32) | lo) >> 11) * (1.0 / 9007199254740992.0);
}

/* The process-wide generator state: the seed and the next unused counter. */
typedef struct flow_rng_state { uint64_t seed, offset; } flow_rng_state;

/* Set the seed and restart the counter at 0 (flow.manual_seed). The seed is 0 until then. */
void flow_rng_manual_seed(uint64_t seed);
flow_rng_state flow_rng_get_state(void);
void flow_rng_set_state(flow_rng_state s);
/* Reserve counters for a logical tensor of n elements: returns the (seed, offset) to draw it with
 * and advances the offset past it, so the next random op sees fresh numbers. */
flow_rng_state flow_rng_reserve(uint64_t n);

#endif
