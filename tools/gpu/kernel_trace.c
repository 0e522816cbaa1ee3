// A CUDA injection library that records every kernel's GPU start and end (CUPTI activity
// records, hardware timestamps) and writes them as a TSV when the process exits: the timeline
// of a frame step as it really runs, inside its CUDA graph, with the gaps between kernels.
// ncu (tools/gpu/step-ncu.sh) times each kernel alone with caches flushed, which overstates the
// small kernels; this shows where a replay's wall time goes.
//
// Built here by tools/gpu/build.sh (gcc, the pinned CUPTI wheel's headers), run there by
// tools/gpu/kernel-trace.sh:  CUDA_INJECTION64_PATH=.../libkernel_trace.so LIMELIGHT_TRACE=out.tsv
// Columns: start_ns end_ns graph_id graph_node_id correlation_id stream_id grid block name.
// With LIMELIGHT_TRACE_API=api.tsv it also records the host's driver calls and the copies and
// fills (tools/gpu/serve-trace.sh: where the host's time between two replays goes). Columns:
// kind (api, memcpy, memset) start_ns end_ns thread (the OS thread of a call, the stream of a
// copy) correlation_id name (the call's, or the copy's direction and bytes). A graph replay's
// kernels carry its cuGraphLaunch's correlation id.
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUFFER_BYTES (8u << 20)

static FILE* trace_out;
static FILE* api_out;

// An API, copy or fill record as a line of api_out.
static void write_api_record(const CUpti_Activity* record) {
    if (record->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
        const CUpti_ActivityAPI* a = (const CUpti_ActivityAPI*)record;
        const char* name = "?";
        cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name);
        fprintf(api_out, "api\t%llu\t%llu\t%u\t%u\t%s\n", (unsigned long long)a->start, (unsigned long long)a->end,
                a->threadId, a->correlationId, name);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        const CUpti_ActivityMemcpy6* m = (const CUpti_ActivityMemcpy6*)record;
        static const char* kinds[] = {"?", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
        const char* kind = m->copyKind < sizeof kinds / sizeof *kinds ? kinds[m->copyKind] : "?";
        fprintf(api_out, "memcpy\t%llu\t%llu\t%u\t%u\t%s %llu B\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->streamId, m->correlationId, kind, (unsigned long long)m->bytes);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
        const CUpti_ActivityMemset4* m = (const CUpti_ActivityMemset4*)record;
        fprintf(api_out, "memset\t%llu\t%llu\t%u\t%u\t%llu B\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->streamId, m->correlationId, (unsigned long long)m->bytes);
    }
}

static void check(CUptiResult r, const char* what) {
    if (r == CUPTI_SUCCESS) return;
    const char* msg = "?";
    cuptiGetResultString(r, &msg);
    fprintf(stderr, "kernel_trace: %s failed: %s\n", what, msg);
}

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    // CUPTI asks for 8-byte alignment; malloc gives 16.
    *buffer = (uint8_t*)malloc(BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity* record = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
            if (api_out) write_api_record(record);
            continue;
        }
        const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)record;
        if (trace_out)
            fprintf(trace_out, "%llu\t%llu\t%u\t%llu\t%u\t%u\t%dx%dx%d\t%dx%dx%d\t%s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->graphId, (unsigned long long)k->graphNodeId, k->correlationId,
                    k->streamId, k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY, k->blockZ,
                    k->name ? k->name : "?");
    }
    size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped);
    if (dropped) fprintf(stderr, "kernel_trace: %zu records dropped\n", dropped);
    free(buffer);
}

static void flush_at_exit(void) {
    check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
    if (trace_out) fclose(trace_out);
    trace_out = NULL;
    if (api_out) fclose(api_out);
    api_out = NULL;
}

// Called by the CUDA driver at cuInit when CUDA_INJECTION64_PATH names this library.
int InitializeInjection(void) {
    const char* path = getenv("LIMELIGHT_TRACE");
    trace_out = fopen(path ? path : "kernel-trace.tsv", "w");
    if (!trace_out) {
        perror("kernel_trace: open");
        return 0;
    }
    fprintf(trace_out, "start_ns\tend_ns\tgraph_id\tgraph_node_id\tcorrelation_id\tstream_id\tgrid\tblock\tname\n");
    check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
    const char* api_path = getenv("LIMELIGHT_TRACE_API");
    if (api_path && *api_path) {
        api_out = fopen(api_path, "w");
        if (!api_out) {
            perror("kernel_trace: open LIMELIGHT_TRACE_API");
        } else {
            fprintf(api_out, "kind\tstart_ns\tend_ns\tthread\tcorrelation_id\tname\n");
            check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER), "cuptiActivityEnable(DRIVER)");
            check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityEnable(MEMCPY)");
            check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "cuptiActivityEnable(MEMSET)");
        }
    }
    atexit(flush_at_exit);
    return 1;
}
