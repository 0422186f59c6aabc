// CUDA build of moe_route.hip: torch's extension loader sends .cu files to nvcc, .hip files to g++.
#include "../moe_route.hip"
