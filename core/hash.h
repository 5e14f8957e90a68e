/* FNV-1a over bytes: the hashes ranks compare (the agreement check, communicator keys and groups). */
#ifndef FLOW_HASH_H
#define FLOW_HASH_H

#include <stddef.h>
#include <stdint.h>

#define FLOW_FNV_START 14695981039346656037ull

/* h extended by the n bytes at p (start from FLOW_FNV_START) */
static inline uint64_t flow_fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

#endif
