/* Element types (see dtype.h). */
#include "dtype.h"

#include <math.h>
#include <string.h>

static const struct { const char *name; size_t size; } info[FLOW_NDTYPES] = {
  [FLOW_F32] = {"float32", 4}, [FLOW_F64] = {"float64", 8}, [FLOW_F16] = {"float16", 2},
  [FLOW_BF16] = {"bfloat16", 2}, [FLOW_I64] = {"int64", 8}, [FLOW_I32] = {"int32", 4},
  [FLOW_U8] = {"uint8", 1}, [FLOW_BOOL] = {"bool", 1},
};

size_t flow_dtype_size(flow_dtype d) { return info[d].size; }
const char *flow_dtype_name(flow_dtype d) { return d < FLOW_NDTYPES ? info[d].name : "?"; }
bool flow_dtype_is_float(flow_dtype d) { return d <= FLOW_BF16; }
bool flow_dtype_is_int(flow_dtype d) { return d >= FLOW_I64 && d < FLOW_NDTYPES; }

int flow_dtype_parse(const char *name, flow_dtype *out) {
  static const struct { const char *alias; flow_dtype d; } aliases[] = {
    {"f32", FLOW_F32}, {"float", FLOW_F32}, {"f64", FLOW_F64}, {"double", FLOW_F64},
    {"f16", FLOW_F16}, {"half", FLOW_F16}, {"bf16", FLOW_BF16}, {"i64", FLOW_I64},
    {"long", FLOW_I64}, {"i32", FLOW_I32}, {"int", FLOW_I32}, {"u8", FLOW_U8},
  };
  for (int d = 0; d < FLOW_NDTYPES; d++)
    if (strcmp(name, info[d].name) == 0) { *out = (flow_dtype)d; return 0; }
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(name, aliases[i].alias) == 0) { *out = aliases[i].d; return 0; }
  return -1;
}

float flow_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) bits = sign;
    else { /* subnormal: value = man * 2^-24 */
      float f = ldexpf((float)man, -24);
      return sign ? -f : f;
    }
  } else if (exp == 31) bits = sign | 0x7f800000u | (man << 13);
  else bits = sign | ((exp + 112) << 23) | (man << 13);
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t flow_float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (x >> 16) & 0x8000;
  int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return sign | 0x7c00 | (man ? 0x200 : 0);
  if (exp >= 31) return sign | 0x7c00;
  if (exp <= 0) {
    if (exp < -10) return sign;
    man |= 0x800000;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return sign | (uint16_t)half;
  }
  uint32_t half = ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; /* carry may round up into inf: correct */
  return sign | (uint16_t)half;
}

uint16_t flow_float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

double flow_dtype_load(flow_dtype d, const void *p) {
  switch (d) {
  case FLOW_F32: return *(const float *)p;
  case FLOW_F64: return *(const double *)p;
  case FLOW_F16: return flow_half_to_float(*(const uint16_t *)p);
  case FLOW_BF16: return flow_bf16_to_float(*(const uint16_t *)p);
  case FLOW_I64: return (double)*(const int64_t *)p;
  case FLOW_I32: return *(const int32_t *)p;
  case FLOW_U8: return *(const uint8_t *)p;
  case FLOW_BOOL: return *(const uint8_t *)p ? 1 : 0;
  default: return 0;
  }
}

void flow_dtype_store(flow_dtype d, void *p, double v) {
  switch (d) {
  case FLOW_F32: *(float *)p = (float)v; break;
  case FLOW_F64: *(double *)p = v; break;
  case FLOW_F16: *(uint16_t *)p = flow_float_to_half((float)v); break;
  case FLOW_BF16: *(uint16_t *)p = flow_float_to_bf16((float)v); break;
  case FLOW_I64: *(int64_t *)p = (int64_t)v; break;
  case FLOW_I32: *(int32_t *)p = (int32_t)v; break;
  case FLOW_U8: *(uint8_t *)p = (uint8_t)v; break;
  case FLOW_BOOL: *(uint8_t *)p = v != 0; break;
  default: break;
  }
}
