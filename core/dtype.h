/* Element types: sizes, names, and float16/bfloat16 <-> float32 conversion. */
#ifndef FLOW_DTYPE_H
#define FLOW_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum flow_dtype {
  FLOW_F32, FLOW_F64, FLOW_F16, FLOW_BF16, FLOW_I64, FLOW_I32, FLOW_U8, FLOW_BOOL,
  FLOW_NDTYPES
} flow_dtype;

size_t flow_dtype_size(flow_dtype d);
const char *flow_dtype_name(flow_dtype d);          /* "float32", ... */
int flow_dtype_parse(const char *name, flow_dtype *out); /* accepts "float32"/"f32"/"float"...; -1 if unknown */
bool flow_dtype_is_float(flow_dtype d);              /* f32 f64 f16 bf16 */
static inline bool flow_dtype_is_half(flow_dtype d) { return d == FLOW_F16 || d == FLOW_BF16; }
bool flow_dtype_is_int(flow_dtype d);                /* i64 i32 u8 bool */

float flow_half_to_float(uint16_t h);
uint16_t flow_float_to_half(float f);
/* a bfloat16 is the float32 of its bits shifted up (inline: loops over many vectorise) */
static inline float flow_bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
uint16_t flow_float_to_bf16(float f);                /* round to nearest even */

/* Read/write one element as double, whatever the dtype (slow path: printing, item, tables). */
double flow_dtype_load(flow_dtype d, const void *p);
void flow_dtype_store(flow_dtype d, void *p, double v);

#endif
