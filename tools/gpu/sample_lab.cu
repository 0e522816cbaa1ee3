// Sampling lab (tools/gpu/sample-lab.sh): the draw kernels of a (patched) kernels/sampling.cu
// timed alone on the rows a random-weight frame step gives them, and their picks hashed (every
// variant must print the same). Rows: the main draw on a flat 4097-candidate row (random
// weights: top-p 0.9 keeps ~3700 ranks) and on a peaked one (a trained model's shape), and a
// codebook head's 4096 bf16 logits (top-k 30). The script may insert PROBE(i) marks (thread 0's
// clock64 at a phase boundary) and LAB_PASS() marks (the same, numbered by how many came before
// in the launch: the radix passes' histogram and bucket ends); their medians over the probed
// launches are printed per phase, with the median number of pass marks.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

__device__ long long lab_probe[2][16];
#define PROBE(i)                                                        \
    do {                                                                \
        if (threadIdx.x == 0) lab_probe[blockIdx.x][(i)] = clock64();   \
    } while (0)

__device__ long long lab_pass[2][16];
__device__ int lab_passes[2];
#define LAB_PASS()                                                      \
    do {                                                                \
        if (threadIdx.x == 0) {                                         \
            const int c = lab_passes[blockIdx.x]++;                     \
            if (c < 16) lab_pass[blockIdx.x][c] = clock64();            \
        }                                                               \
    } while (0)

#include "sampling.cu"  // the variant's copy first on the include path

#include "lab.cuh"  // CK

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float uniform(float lo, float hi) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / 16777216.0));
}

struct Case {
    const char* name;
    bool head;
    std::vector<float> logits;
};

int main() {
    int clock_khz = 0;
    CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    const int n_main = 4097, n_head = 4096;
    std::vector<Case> cases;
    {
        Case flat{"main, flat row (random weights), top-p 0.9", false, {}};
        for (int i = 0; i < n_main; ++i) flat.logits.push_back(uniform(-0.05f, 0.05f));
        cases.push_back(flat);
        Case peaked{"main, peaked row, top-p 0.9", false, {}};
        for (int i = 0; i < n_main; ++i) peaked.logits.push_back(uniform(-1.f, 1.f));
        for (int j = 0; j < 5; ++j) peaked.logits[(j * 797) % n_main] = uniform(6.f, 10.f);
        cases.push_back(peaked);
        Case head{"head, uniform(-2, 2) bf16, top-k 30, top-p 0.9", true, {}};
        for (int i = 0; i < n_head; ++i) head.logits.push_back(__bfloat162float(__float2bfloat16(uniform(-2.f, 2.f))));
        cases.push_back(head);
    }
    CK(cudaFuncSetAttribute(sample_main_draws, cudaFuncAttributeMaxDynamicSharedMemorySize, 8192 * 8));
    float* d_main;
    bf16* d_head;
    uint32_t* d_index;
    SamplerState* d_state;
    SamplerOut* d_out;
    CK(cudaMalloc(&d_main, n_main * 4));
    CK(cudaMalloc(&d_head, n_head * 2));
    CK(cudaMalloc(&d_index, n_main * 4));
    CK(cudaMalloc(&d_state, sizeof(SamplerState)));
    CK(cudaMalloc(&d_out, sizeof(SamplerOut)));
    std::vector<uint32_t> index(n_main);
    for (int i = 0; i < n_main; ++i) index[i] = i;
    CK(cudaMemcpy(d_index, index.data(), n_main * 4, cudaMemcpyHostToDevice));
    cudaEvent_t t0, t1;
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    for (const Case& c : cases) {
        if (c.head) {
            std::vector<bf16> h(n_head);
            for (int i = 0; i < n_head; ++i) h[i] = __float2bfloat16(c.logits[i]);
            CK(cudaMemcpy(d_head, h.data(), n_head * 2, cudaMemcpyHostToDevice));
        } else {
            CK(cudaMemcpy(d_main, c.logits.data(), n_main * 4, cudaMemcpyHostToDevice));
        }
        const auto launch = [&](uint32_t frame) {
            SamplerState st{};
            st.seed_lo = 0x1234567u, st.seed_hi = 0x89abcdefu, st.frame_lo = frame;
            st.temperature = 1.f, st.top_p = 0.9f, st.main_top_k = UINT32_MAX, st.head_top_k = 30;
            CK(cudaMemcpyAsync(d_state, &st, sizeof st, cudaMemcpyHostToDevice));
            if (c.head) sample_head<<<1, THREADS, n_head * 8>>>(d_head, n_head, n_head, 0, d_state, d_out);
            else sample_main_draws<<<dim3(2, 1), THREADS, 8192 * 8>>>(d_main, d_index, n_main, 8192, n_main, d_state, d_out);
        };
        // Picks of 64 frames (their hash) and the probes of 32.
        uint64_t hash = 1469598103934665603ull;
        std::vector<std::vector<double>> phase(16), pass(16);
        std::vector<int> passes;
        for (uint32_t frame = 0; frame < 64; ++frame) {
            long long zero[2][16] = {};
            int zero_passes[2] = {};
            CK(cudaMemcpyToSymbol(lab_probe, zero, sizeof zero));
            CK(cudaMemcpyToSymbol(lab_pass, zero, sizeof zero));
            CK(cudaMemcpyToSymbol(lab_passes, zero_passes, sizeof zero_passes));
            launch(frame);
            CK(cudaDeviceSynchronize());
            SamplerOut out;
            CK(cudaMemcpy(&out, d_out, sizeof out, cudaMemcpyDeviceToHost));
            const uint32_t pick = c.head ? out.row[2] : out.pick[0];
            hash = (hash ^ pick) * 1099511628211ull;
            long long p[2][16];
            CK(cudaMemcpyFromSymbol(p, lab_probe, sizeof p));
            for (int i = 1; i < 16; ++i)
                if (p[0][i] && p[0][0]) phase[i].push_back((p[0][i] - p[0][0]) / (clock_khz * 1e-3));
            long long q[2][16];
            int np[2];
            CK(cudaMemcpyFromSymbol(q, lab_pass, sizeof q));
            CK(cudaMemcpyFromSymbol(np, lab_passes, sizeof np));
            passes.push_back(np[0]);
            for (int i = 0; i < std::min(np[0], 16); ++i)
                if (p[0][0]) pass[i].push_back((q[0][i] - p[0][0]) / (clock_khz * 1e-3));
        }
        // Back-to-back launches, timed (the state copy between them as in the lab's loop).
        CK(cudaEventRecord(t0));
        const int reps = 200;
        for (int r = 0; r < reps; ++r) launch(1000 + r);
        CK(cudaEventRecord(t1));
        CK(cudaEventSynchronize(t1));
        float ms = 0.f;
        CK(cudaEventElapsedTime(&ms, t0, t1));
        printf("%-48s %7.2f us a launch (with a 100 B state copy), picks hash %016llx\n", c.name, 1000.f * ms / reps,
               (unsigned long long)hash);
        for (int i = 1; i < 16; ++i) {
            if (phase[i].empty()) continue;
            std::sort(phase[i].begin(), phase[i].end());
            printf("    probe %2d: %7.2f us after the draw's start (median of %zu)\n", i, phase[i][phase[i].size() / 2],
                   phase[i].size());
        }
        std::sort(passes.begin(), passes.end());
        if (passes.back() > 0) printf("    pass marks: median %d, max %d\n", passes[passes.size() / 2], passes.back());
        for (int i = 0; i < 16; ++i) {
            if (pass[i].empty()) continue;
            std::sort(pass[i].begin(), pass[i].end());
            printf("    pass mark %2d: %7.2f us after the draw's start (median of %zu)\n", i, pass[i][pass[i].size() / 2],
                   pass[i].size());
        }
    }
    return 0;
}
