// CUDA build of aligner_gather.hip: torch's extension loader sends .cu files to nvcc, .hip files to g++.
#include "../aligner_gather.hip"
