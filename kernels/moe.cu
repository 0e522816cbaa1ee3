// moe kernels (being written).
#include "common.cuh"
