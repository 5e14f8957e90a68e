# CUDA backend: filled in by the CUDA issue. Sets FLOW_CUDA_LIBS.
set(FLOW_CUDA_LIBS "")
