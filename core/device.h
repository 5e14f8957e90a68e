/* Devices (cpu, cuda:N) and the per-device-type memory interface. The CUDA backend registers
 * its allocator and copy functions when its plugin loads, so core needs no CUDA headers. */
#ifndef FLOW_DEVICE_H
#define FLOW_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

typedef enum flow_devtype { FLOW_CPU, FLOW_CUDA, FLOW_NDEVTYPES } flow_devtype;

typedef struct flow_device {
  flow_devtype type;
  int index;
} flow_device;

typedef struct flow_device_impl {
  void *(*alloc)(int index, size_t nbytes);          /* NULL + flow_error_set on failure */
  void (*free)(int index, void *p, size_t nbytes);
  /* Copy nbytes; either side may be host memory (the other device's type is given). */
  int (*copy)(void *dst, flow_device dst_dev, const void *src, flow_device src_dev, size_t nbytes);
  /* Within one device: `height` rows of `width` bytes, rows `dpitch` / `spitch` bytes apart (the
   * strided blocks boxing moves; cudaMemcpy2D on CUDA). */
  int (*copy2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                flow_device dev);
  int (*zero)(void *p, flow_device dev, size_t nbytes);
  int (*synchronize)(int index);
} flow_device_impl;

extern const flow_device FLOW_DEVICE_CPU;

void flow_device_register(flow_devtype type, const flow_device_impl *impl);
/* A backend that loads on first use: flow_device_get calls `load` (which must be thread-safe and
 * register the type's interface) while none is registered. */
void flow_device_set_loader(flow_devtype type, void (*load)(void));
const flow_device_impl *flow_device_get(flow_devtype type); /* NULL if that backend is absent */
int flow_device_parse(const char *s, flow_device *out);      /* "cpu", "cuda", "cuda:1" */
void flow_device_name(flow_device d, char *buf, size_t n);   /* "cpu", "cuda:0" */
bool flow_device_eq(flow_device a, flow_device b);
/* The largest single host allocation: FLOW_MAX_ALLOC_BYTES, else physical memory. */
size_t flow_device_cpu_max_alloc(void);
void flow_device_cpu_empty_cache(void);   /* return cached host blocks to malloc */

#endif
