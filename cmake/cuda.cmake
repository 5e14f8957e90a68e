# CUDA backend (included when FLOW_CUDA is ON): the plugin flow_cuda.so, which the core loads with
# dlopen on first CUDA use (core/cuda.c). It holds kernels/cuda/*.cu (nvcc, sm_80 and sm_90), the
# device runtime and the NCCL communicator (core/cuda/*.c), and is the only thing that links the CUDA
# runtime, cuBLAS(Lt), cuDNN and NCCL; its calls into the core resolve against flowlua or flow.so
# when it loads. The core sees FLOW_HAVE_CUDA and where the plugin lies.
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
# cuDNN (kernels/cuda/conv.cu): convolution, pooling, batch norm.
find_library(FLOW_CUDNN_LIB cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64 REQUIRED)
find_path(FLOW_CUDNN_INCLUDE cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)

file(GLOB FLOW_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu ${CMAKE_SOURCE_DIR}/core/cuda/*.c)
add_library(flow_cuda_plugin MODULE ${FLOW_CUDA_SOURCES})
set_target_properties(flow_cuda_plugin PROPERTIES OUTPUT_NAME flow_cuda PREFIX "" CUDA_STANDARD 17
  CUDA_RUNTIME_LIBRARY Shared)
# The directory's C warning and -march flags mean nothing to nvcc: they stay on the C files, and the
# CUDA files get their own.
get_property(flow_c_options TARGET flow_cuda_plugin PROPERTY COMPILE_OPTIONS)
set_property(TARGET flow_cuda_plugin PROPERTY COMPILE_OPTIONS "$<$<COMPILE_LANGUAGE:C>:${flow_c_options}>"
  $<$<COMPILE_LANGUAGE:CUDA>:-O3 -Xcompiler=-fPIC,-Wall,-Wno-unused-parameter>)
target_include_directories(flow_cuda_plugin PRIVATE ${CUDAToolkit_INCLUDE_DIRS} ${FLOW_NCCL_INCLUDE} ${FLOW_CUDNN_INCLUDE})
target_compile_definitions(flow_cuda_plugin PRIVATE FLOW_HAVE_CUDA=1)
target_link_libraries(flow_cuda_plugin PRIVATE CUDA::cudart CUDA::cublasLt CUDA::cublas ${FLOW_NCCL_LIB} ${FLOW_CUDNN_LIB})

# The core: which file to load, and where an installed flowlua finds it (the plugin is installed
# next to flow.so; flowlua and flow.so of a build folder find it beside them).
set(cmod_dir ${FLOW_LUA_CMOD_DIR})
if(NOT IS_ABSOLUTE "${cmod_dir}")
  set(cmod_dir "${CMAKE_INSTALL_PREFIX}/${cmod_dir}")
endif()
file(RELATIVE_PATH FLOW_CUDA_PLUGIN_FROM_BIN "${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}" "${cmod_dir}")
if(FLOW_CUDA_PLUGIN_FROM_BIN STREQUAL "")
  set(FLOW_CUDA_PLUGIN_FROM_BIN ".")
endif()
target_compile_definitions(flow_core PRIVATE FLOW_HAVE_CUDA=1 FLOW_CUDA_PLUGIN_FILE="flow_cuda.so"
  FLOW_CUDA_PLUGIN_FROM_BIN="${FLOW_CUDA_PLUGIN_FROM_BIN}")
install(TARGETS flow_cuda_plugin LIBRARY DESTINATION ${FLOW_LUA_CMOD_DIR})
