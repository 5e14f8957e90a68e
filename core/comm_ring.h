/* Shared-memory byte rings between the ranks of `flowlua --ranks N` (comm_local.c carries its
 * messages over them): one single-producer/single-consumer ring per ordered pair of ranks and a
 * bell per rank, in one MAP_SHARED region mapped before the ranks are forked. Internal to core/. */
#ifndef FLOW_COMM_RING_H
#define FLOW_COMM_RING_H

#include <stddef.h>
#include <stdint.h>

typedef struct flow_ring_region flow_ring_region;

/* The region for n ranks, inherited by the processes forked after; NULL (errno set) if it cannot be
 * mapped. */
flow_ring_region *flow_ring_map(int n);

/* The producer `from`: copy as many of len bytes as fit into the ring to `to` now (0 when it is
 * full), and ring `to`'s bell when any went. */
size_t flow_ring_put(flow_ring_region *s, int from, int to, const void *p, size_t len);
/* The consumer `to`: copy up to len of the bytes waiting in the ring from `from`, freeing their
 * room (and waking its producer if it waits for room). */
size_t flow_ring_get(flow_ring_region *s, int from, int to, void *p, size_t len);

/* Sleeping until something changes, without losing a wake-up: `arm` counts the caller as a sleeper
 * and returns the state it saw; the caller then looks once more for what it waits for, and `wait`
 * sleeps up to `seconds` unless the state moved since (seconds <= 0: it does not sleep), and stops
 * counting the caller. A rank's bell moves when a peer writes to it or `ring` is called; the room
 * of the ring from -> to moves when its consumer frees some or `wake_room` is called. */
uint32_t flow_ring_bell_arm(flow_ring_region *s, int me);
void flow_ring_bell_wait(flow_ring_region *s, int me, uint32_t seen, double seconds);
void flow_ring_bell_ring(flow_ring_region *s, int to);
uint32_t flow_ring_room_arm(flow_ring_region *s, int from, int to);
void flow_ring_room_wait(flow_ring_region *s, int from, int to, uint32_t seen, double seconds);
void flow_ring_wake_room(flow_ring_region *s, int from, int to);

#endif
