/* Instantiates the file named by FLOW_GENERIC_FILE once per real type, with `real` the element
 * type, GEN(name) the name suffixed by dtype (name_f32, name_f64) and BLAS(fn) the BLAS routine
 * of that precision (cblas_sgemm, cblas_dgemm): one generic source instead
 * of a copy per dtype, as Torch7's THGenerateFloatTypes.h. No include guard: used once per file. */
#ifndef FLOW_GENERIC_FILE
#error "define FLOW_GENERIC_FILE before including generic.h"
#endif
#define real float
#define GEN(name) name##_f32
#define BLAS(fn) cblas_s##fn
#include FLOW_GENERIC_FILE
#undef real
#undef GEN
#undef BLAS
#define real double
#define GEN(name) name##_f64
#define BLAS(fn) cblas_d##fn
#include FLOW_GENERIC_FILE
#undef real
#undef GEN
#undef BLAS
#undef FLOW_GENERIC_FILE
