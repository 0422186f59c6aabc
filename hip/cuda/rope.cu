// CUDA build of rope.hip: torch's extension loader sends .cu files to nvcc, .hip files to g++.
#include "../rope.hip"
