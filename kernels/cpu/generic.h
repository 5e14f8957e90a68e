/* Instantiates the file named by FLOW_GENERIC_FILE once per real type, with `real` the element
 * type and GEN(name) the name suffixed by dtype (name_f32, name_f64; GEN(flow_cpu_gemm) is the
 * matrix product of that precision): one generic source instead of a copy per dtype, as Torch7's
 * THGenerateFloatTypes.h. No include guard: used once per file. */
#ifndef FLOW_GENERIC_FILE
#error "define FLOW_GENERIC_FILE before including generic.h"
#endif
#define real float
#define GEN(name) name##_f32
#include FLOW_GENERIC_FILE
#undef real
#undef GEN
#define real double
#define GEN(name) name##_f64
#include FLOW_GENERIC_FILE
#undef real
#undef GEN
#undef FLOW_GENERIC_FILE
