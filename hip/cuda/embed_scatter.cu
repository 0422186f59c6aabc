// CUDA build of embed_scatter.hip: torch's extension loader sends .cu files to nvcc, .hip files to g++.
#include "../embed_scatter.hip"
