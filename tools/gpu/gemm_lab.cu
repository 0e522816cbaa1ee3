// Prefill GEMM lab (tools/gpu/gemm-lab.sh): the engine's linear_gemm_r32/_r64/_r128 against
// wgmma tile shapes. Checks every variant against an fp64 reference on sampled rows, bitwise
// equality of all wgmma variants (tile shapes must not change bits), and row-position invariance
// (x shifted by 37 rows).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cmath>
#include <cstring>
#include "linear_gemm.cu"  // compiled with -I kernels

#include "lab.cuh"  // CK

template <int WGS, int BN, int STAGES, int KEEP>
__global__ void __launch_bounds__(128 * WGS) gemm_wg(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                    bf16* __restrict__ y, int rows, int n, int k) {
    linear_gemm_wg<WGS, BN, STAGES, KEEP>(x, w, y, rows, n, k);
}

struct Variant {
    const char* name;
    void (*launch)(const bf16*, const bf16*, bf16*, int, int, int, cudaStream_t);
};

template <int WGS, int BN, int STAGES, int KEEP>
void launch_wg(const bf16* x, const bf16* w, bf16* y, int rows, int n, int k, cudaStream_t st) {
    constexpr int smem = STAGES * (64 * WGS + BN) * 128 + 1024;
    static bool init = false;
    if (!init) {
        CK(cudaFuncSetAttribute(gemm_wg<WGS, BN, STAGES, KEEP>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        init = true;
    }
    dim3 grid((n + BN - 1) / BN, (rows + 64 * WGS - 1) / (64 * WGS));
    gemm_wg<WGS, BN, STAGES, KEEP><<<grid, 128 * WGS, smem, st>>>(x, w, y, rows, n, k);
}

template <int BM>
void launch_base(const bf16* x, const bf16* w, bf16* y, int rows, int n, int k, cudaStream_t st) {
    auto f = BM == 32 ? linear_gemm_r32 : BM == 64 ? linear_gemm_r64 : linear_gemm_r128;
    const int smem = (BM == 128 ? 3 : 4) * (BM + 128) * 128;
    static bool init = false;
    if (!init) {
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        init = true;
    }
    dim3 grid((n + 127) / 128, (rows + BM - 1) / BM);
    f<<<grid, 256, smem, st>>>(x, w, y, rows, n, k);
}

static float bf2f(uint16_t v) { uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return u >> 16; }

int main() {
    Variant vs[] = {
        {"base_r32", launch_base<32>},
        {"base_r64", launch_base<64>},
        {"base_r128", launch_base<128>},
        {"wg1_n128_s4_k0", launch_wg<1, 128, 4, 0>},
        {"wg1_n128_s5_k1", launch_wg<1, 128, 5, 1>},
        {"wg1_n64_s6_k1", launch_wg<1, 64, 6, 1>},
        {"wg2_n128_s4_k1", launch_wg<2, 128, 4, 1>},
        {"wg1_n256_s4_k1", launch_wg<1, 256, 4, 1>},
        {"wg2_n256_s3_k1", launch_wg<2, 256, 3, 1>},
        {"wg4_n64_s4_k1", launch_wg<4, 64, 4, 1>},
    };
    const int nv = sizeof(vs) / sizeof(vs[0]);
    struct Shape { int m, n, k; } shapes[] = {
        {200, 2048, 2048}, {200, 4096, 2048}, {200, 512, 2048}, {200, 2048, 4096}, {200, 8192, 2048},
        {1000, 4096, 2048}, {1000, 2048, 4096}, {1000, 8192, 2048}, {85, 4096, 2048},
    };
    const int SHIFT = 37;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    char* flush;
    const size_t FLUSH = 256 << 20;
    CK(cudaMalloc(&flush, FLUSH));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    srand(12345);
    bool all_ok = true;
    for (auto sh : shapes) {
        const int M = sh.m, N = sh.n, K = sh.k;
        std::vector<uint16_t> hx((size_t)(M + SHIFT) * K), hw((size_t)N * K);
        for (auto& v : hx) v = f2bf((rand() / (float)RAND_MAX * 2 - 1));
        for (auto& v : hw) v = f2bf((rand() / (float)RAND_MAX * 2 - 1) * 0.05f);
        bf16 *dx, *dw, *dy, *dy2;
        CK(cudaMalloc(&dx, hx.size() * 2));
        CK(cudaMalloc(&dw, hw.size() * 2));
        CK(cudaMalloc(&dy, (size_t)(M + SHIFT) * N * 2));
        CK(cudaMalloc(&dy2, (size_t)(M + SHIFT) * N * 2));
        CK(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dw, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
        // fp64 reference on sampled rows (of x rows SHIFT.., i.e. row r of the unshifted call).
        const int samples[] = {0, 1, 7, 15, 16, 63, 64, 65, 127, 128, 199 % M, (M - 1)};
        std::vector<uint16_t> first;
        printf("shape M=%d N=%d K=%d (floor DRAM %.1f us at 3.0TB/s, %.1f us at 700 TFLOP/s)\n", M, N, K,
               (double)N * K * 2 / 3.0e6, 2.0 * M * N * K / 700e6);
        std::vector<int> ref_rows;
        for (int r : samples) if (r < M && std::find(ref_rows.begin(), ref_rows.end(), r) == ref_rows.end()) ref_rows.push_back(r);
        std::vector<double> ref(ref_rows.size() * N), refa(ref_rows.size() * N);
        for (size_t si = 0; si < ref_rows.size(); ++si)
            for (int f = 0; f < N; ++f) {
                double s = 0, a = 0;
                for (int i = 0; i < K; ++i) {
                    const double p = (double)bf2f(hx[(size_t)(ref_rows[si] + SHIFT) * K + i]) * bf2f(hw[(size_t)f * K + i]);
                    s += p;
                    a += fabs(p);
                }
                ref[si * N + f] = s;
                refa[si * N + f] = a;
            }
        for (int v = 0; v < nv; ++v) {
            const bool wgv = strncmp(vs[v].name, "wg", 2) == 0;
            std::vector<uint16_t> hy((size_t)M * N), hy2((size_t)M * N);
            CK(cudaMemset(dy, 0xff, (size_t)(M + SHIFT) * N * 2));  // NaN poison
            vs[v].launch(dx + (size_t)SHIFT * K, dw, dy, M, N, K, st);
            CK(cudaStreamSynchronize(st));
            CK(cudaGetLastError());
            CK(cudaMemcpy(hy.data(), dy, hy.size() * 2, cudaMemcpyDeviceToHost));
            // shifted: rows of x from 0, M + SHIFT rows; row r + SHIFT must equal row r above
            CK(cudaMemset(dy2, 0xff, (size_t)(M + SHIFT) * N * 2));
            vs[v].launch(dx, dw, dy2, M + SHIFT, N, K, st);
            CK(cudaStreamSynchronize(st));
            CK(cudaMemcpy(hy2.data(), dy2 + (size_t)SHIFT * N, hy2.size() * 2, cudaMemcpyDeviceToHost));
            double maxrel = 0;
            bool nan = false;
            for (size_t si = 0; si < ref_rows.size(); ++si) {
                const int r = ref_rows[si];
                for (int f = 0; f < N; ++f) {
                    const float got = bf2f(hy[(size_t)r * N + f]);
                    if (std::isnan(got)) nan = true;
                    maxrel = std::max(maxrel, fabs(got - ref[si * N + f]) / (refa[si * N + f] + 1e-30));
                }
            }
            size_t shift_diff = 0, nan_all = 0;
            for (size_t i = 0; i < hy.size(); ++i) {
                if (hy[i] != hy2[i]) ++shift_diff;
                if (std::isnan(bf2f(hy[i]))) ++nan_all;
            }
            size_t vs_first = 0;
            if (wgv) {
                if (first.empty()) first = hy;
                else for (size_t i = 0; i < hy.size(); ++i) vs_first += hy[i] != first[i];
            }
            // timing: flush L2, then the kernel alone
            std::vector<float> ts;
            for (int it = 0; it < 15; ++it) {
                CK(cudaMemsetAsync(flush, it, FLUSH, st));
                CK(cudaEventRecord(e0, st));
                vs[v].launch(dx + (size_t)SHIFT * K, dw, dy, M, N, K, st);
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (it >= 3) ts.push_back(ms * 1000);
            }
            std::sort(ts.begin(), ts.end());
            const bool ok = !nan && nan_all == 0 && maxrel < 8e-3 && shift_diff == 0 && vs_first == 0;
            all_ok &= ok;
            printf("  %-16s %8.1f us (min %7.1f)  maxrel %.2e  nan %zu  shift_diff %zu  vs_first_wg %zu  %s\n", vs[v].name,
                   ts[ts.size() / 2], ts[0], maxrel, nan_all, shift_diff, vs_first, ok ? "ok" : "FAIL");
        }
        CK(cudaFree(dx)); CK(cudaFree(dw)); CK(cudaFree(dy)); CK(cudaFree(dy2));
    }
    printf(all_ok ? "ALL OK\n" : "SOME FAILED\n");
    return 0;
}
