// CUDA build of patch_gemm.hip: torch's extension loader sends .cu files to nvcc, .hip files to g++.
#include "../patch_gemm.hip"
