// What the standalone kernel labs (tools/gpu/*_lab.cu) share: a CUDA runtime call checked, the
// lab stopped with the error and its place.
#pragma once
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e = (x);                                                                       \
        if (e != cudaSuccess) {                                                                    \
            printf("CUDA %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__);             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
