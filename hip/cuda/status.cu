// CUDA build of status.hip: torch's extension loader sends .cu files to nvcc, .hip files to g++.
#include "../status.hip"
