// Does a kernel captured after a side stream's join launch early (programmatic dependent launch)?
// ON THE GPU MACHINE: tools/gpu/pdl-join-lab.sh. The decode MoE's combine follows the join of
// the shared expert's side stream, and run 24's trace showed it never starts before the kernel
// ahead of it ends. This lab captures the same shape:
//
//   main: A (long, triggers its dependents at once) ─────────────┐
//   side: B (short, after the fork) ── join ──────────────────── C (PDL launch)
//
// and times C's entry (before its griddepcontrol.wait) against A's end, for four ways of
// capturing it:
//   plain      the launch after cudaStreamWaitEvent, as limelight does now;
//   rewritten  after the wait, the capture's dependencies set again with A's edge programmatic
//              (cudaStreamUpdateCaptureDependencies with edge data) and B's a full edge;
//   rewritten-plain  the same rewrite, C launched without the PDL attribute (so the launch
//              keeps the rewritten edge types instead of making every edge programmatic);
//   no-join    C with no join at all (the early launch PDL gives a lone predecessor).
// Each prints the edges of C's node as captured and the median over replays of
// (C's entry − A's end) in µs: negative means C was resident before A ended.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "lab.cuh"

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Spins for `ns`, then records its end; lets its dependents launch at once.
__global__ void long_a(unsigned long long ns, unsigned long long* stamps) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const unsigned long long t0 = now_ns();
    while (now_ns() - t0 < ns) {
    }
    if (threadIdx.x == 0) stamps[0] = now_ns();
}

__global__ void short_b(unsigned long long* stamps) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (threadIdx.x == 0) stamps[1] = now_ns();
}

// Records its entry, waits for its predecessors, records that, and checks A's stamp is there.
__global__ void dependent_c(unsigned long long* stamps) {
    const unsigned long long entry = now_ns();
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0) {
        stamps[2] = entry;
        stamps[3] = now_ns();
        stamps[4] = stamps[0] != 0 && stamps[1] != 0;  // both predecessors' writes visible
    }
}

// One block of 32 threads of `k` on `s`, with programmatic stream serialization when `pdl`.
template <class... Args>
static void launch_one(void (*k)(Args...), cudaStream_t s, bool pdl, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(32);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, k, args...));
}

enum Mode { PLAIN, REWRITTEN, REWRITTEN_PLAIN, NO_JOIN };
static const char* mode_name[] = {"plain", "rewritten", "rewritten-plain", "no-join"};

static void print_edges(cudaGraph_t graph) {
    size_t n = 0;
    CK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n));
    std::vector<cudaGraphNode_t> from(n), to(n);
    std::vector<cudaGraphEdgeData> data(n);
    CK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n));
    for (size_t i = 0; i < n; ++i) {
        cudaKernelNodeParams pf = {}, pt = {};
        cudaGraphNodeType tf, tt;
        CK(cudaGraphNodeGetType(from[i], &tf));
        CK(cudaGraphNodeGetType(to[i], &tt));
        void* ff = nullptr;
        void* ft = nullptr;
        if (tf == cudaGraphNodeTypeKernel && cudaGraphKernelNodeGetParams(from[i], &pf) == cudaSuccess) ff = pf.func;
        if (tt == cudaGraphNodeTypeKernel && cudaGraphKernelNodeGetParams(to[i], &pt) == cudaSuccess) ft = pt.func;
        auto name = [](void* f, cudaGraphNodeType t) {
            if (f == (void*)long_a) return "A";
            if (f == (void*)short_b) return "B";
            if (f == (void*)dependent_c) return "C";
            return t == cudaGraphNodeTypeKernel ? "kernel?" : "other";
        };
        printf("    edge %s -> %s: from_port %d to_port %d type %d\n", name(ff, tf), name(ft, tt), data[i].from_port,
               data[i].to_port, data[i].type);
    }
}

static void run(Mode mode, unsigned long long spin_ns) {
    cudaStream_t main_s, side_s;
    CK(cudaStreamCreateWithFlags(&main_s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&side_s, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    unsigned long long* stamps;
    CK(cudaMalloc(&stamps, 8 * sizeof(unsigned long long)));

    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(main_s, cudaStreamCaptureModeThreadLocal));
    CK(cudaMemsetAsync(stamps, 0, 8 * sizeof(unsigned long long), main_s));
    CK(cudaEventRecord(fork, main_s));
    CK(cudaStreamWaitEvent(side_s, fork, 0));
    launch_one(long_a, main_s, false, spin_ns, stamps);
    launch_one(short_b, side_s, true, stamps);
    if (mode != NO_JOIN) {
        // A's node: the main stream's one dependency before the join.
        cudaStreamCaptureStatus status;
        const cudaGraphNode_t* deps = nullptr;
        size_t ndeps = 0;
        CK(cudaStreamGetCaptureInfo(main_s, &status, nullptr, nullptr, &deps, nullptr, &ndeps));
        const cudaGraphNode_t a_node = ndeps == 1 ? deps[0] : nullptr;
        CK(cudaEventRecord(join, side_s));
        CK(cudaStreamWaitEvent(main_s, join, 0));
        if ((mode == REWRITTEN || mode == REWRITTEN_PLAIN) && a_node) {
            CK(cudaStreamGetCaptureInfo(main_s, &status, nullptr, nullptr, &deps, nullptr, &ndeps));
            std::vector<cudaGraphNode_t> nodes(deps, deps + ndeps);
            std::vector<cudaGraphEdgeData> data(ndeps);
            for (size_t i = 0; i < ndeps; ++i) {
                data[i] = {};
                if (nodes[i] == a_node) {
                    data[i].from_port = cudaGraphKernelNodePortProgrammatic;
                    data[i].type = cudaGraphDependencyTypeProgrammatic;
                }
            }
            CK(cudaStreamUpdateCaptureDependencies(main_s, nodes.data(), data.data(), ndeps,
                                                       cudaStreamSetCaptureDependencies));
        }
    }
    launch_one(dependent_c, main_s, mode != REWRITTEN_PLAIN, stamps);
    if (mode == NO_JOIN) {  // the side stream still joins the capture, after C
        CK(cudaEventRecord(join, side_s));
        CK(cudaStreamWaitEvent(main_s, join, 0));
    }
    CK(cudaStreamEndCapture(main_s, &graph));
    printf("%s:\n", mode_name[mode]);
    print_edges(graph);
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    std::vector<double> lead, waited;
    int visible = 1;
    for (int i = 0; i < 50; ++i) {
        CK(cudaGraphLaunch(exec, main_s));
        CK(cudaStreamSynchronize(main_s));
        unsigned long long h[8];
        CK(cudaMemcpy(h, stamps, sizeof h, cudaMemcpyDeviceToHost));
        if (i < 5) continue;
        lead.push_back(((double)h[2] - (double)h[0]) / 1e3);
        waited.push_back(((double)h[3] - (double)h[0]) / 1e3);
        visible &= h[4] == 1;
    }
    std::sort(lead.begin(), lead.end());
    std::sort(waited.begin(), waited.end());
    printf("  C's entry - A's end: median %.2f us (min %.2f, max %.2f); C past its wait - A's end: median %.2f us;"
           " both predecessors' writes seen after the wait: %s\n",
           lead[lead.size() / 2], lead.front(), lead.back(), waited[waited.size() / 2], visible ? "yes" : "NO");
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaFree(stamps));
}

int main() {
    CK(cudaFree(nullptr));
    const unsigned long long spin = 20000;  // A runs 20 µs
    run(PLAIN, spin);
    run(REWRITTEN, spin);
    run(REWRITTEN_PLAIN, spin);
    run(NO_JOIN, spin);
    return 0;
}
