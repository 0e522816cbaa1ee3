// attention kernels (being written).
#include "common.cuh"
