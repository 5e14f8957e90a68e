# CUDA backend (included when FLOW_CUDA is ON): kernels/cuda/*.cu built by nvcc for sm_80 and sm_90
# into a static library that flowlua and flow.so link, with the CUDA runtime, cuBLAS(Lt) and NCCL.
# Sets FLOW_CUDA_LIBS; core/cuda.c and lua/bind_cuda.c see FLOW_HAVE_CUDA.
if(NOT CMAKE_CUDA_COMPILER)
  set(CMAKE_CUDA_COMPILER ${FLOW_NVCC})
endif()
if(NOT CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real)  # A100, H100/H200: SASS only, keeps the build short
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
find_library(FLOW_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib REQUIRED)
find_path(FLOW_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)

file(GLOB FLOW_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu)
add_library(flow_cuda STATIC ${FLOW_CUDA_SOURCES})
# The directory's C warning and -march flags mean nothing to nvcc: replace them for this target.
set_property(TARGET flow_cuda PROPERTY COMPILE_OPTIONS
  $<$<COMPILE_LANGUAGE:CUDA>:-O3 -Xcompiler=-fPIC,-Wall,-Wno-unused-parameter>)
set_target_properties(flow_cuda PROPERTIES CUDA_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
target_include_directories(flow_cuda PRIVATE ${LUA_INCLUDE_DIRS} ${FLOW_NCCL_INCLUDE})
target_compile_definitions(flow_cuda PRIVATE FLOW_HAVE_CUDA=1)

# The C side: the device runtime (core/cuda.c), NCCL glue and the bindings include CUDA headers.
target_include_directories(flow_core PRIVATE ${CUDAToolkit_INCLUDE_DIRS} ${FLOW_NCCL_INCLUDE})
target_compile_definitions(flow_core PRIVATE FLOW_HAVE_CUDA=1)

# cuDNN (kernels/cuda/conv.cu): convolution, pooling, batch norm.
find_library(FLOW_CUDNN_LIB cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64 REQUIRED)
find_path(FLOW_CUDNN_INCLUDE cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
target_include_directories(flow_cuda PRIVATE ${FLOW_CUDNN_INCLUDE})
set(FLOW_CUDA_LIBS flow_cuda CUDA::cudart CUDA::cublasLt CUDA::cublas ${FLOW_NCCL_LIB} ${FLOW_CUDNN_LIB})
