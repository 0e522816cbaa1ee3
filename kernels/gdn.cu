// gdn kernels (being written).
#include "common.cuh"
