/* The process-wide Philox generator state (see rng.h). Every rank of a job starts from the same
 * state and reserves the same ranges in the same order, so global random tensors agree. */
#include "rng.h"

static flow_rng_state state;

void flow_rng_manual_seed(uint64_t seed) {
  state.seed = seed;
  state.offset = 0;
}

flow_rng_state flow_rng_get_state(void) { return state; }
void flow_rng_set_state(flow_rng_state s) { state = s; }

/* One counter per element: element i of the reserved range uses counter offset + i. */
flow_rng_state flow_rng_reserve(uint64_t n) {
  flow_rng_state r = state;
  state.offset += n;
  return r;
}
