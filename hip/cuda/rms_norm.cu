// CUDA build of rms_norm.hip: torch's extension loader sends .cu files to nvcc, .hip files to g++.
#include "../rms_norm.hip"
