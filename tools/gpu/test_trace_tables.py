"""The trace tables' rules on small synthetic traces (CPU only; run by tools/test.sh).

The GPU scripts (kernel-trace.sh, serve-trace.sh) feed these readers CUPTI's records; here the
records are written by hand so that each rule's answer is known exactly.
"""
import lzma
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import serve_trace_table  # noqa: E402
import trace_table  # noqa: E402

KERNEL_HEADER = "start_ns\tend_ns\tgraph_id\tgraph_node_id\tcorrelation_id\tstream_id\tgrid\tblock\tname\n"
API_HEADER = "kind\tstart_ns\tend_ns\tthread\tcorrelation_id\tname\n"


def kernel_line(start, end, graph, correlation, name, stream=13):
    return f"{start}\t{end}\t{graph}\t0\t{correlation}\t{stream}\t1x1x1\t32x1x1\t{name}\n"


def replay_lines(graph, correlation, start, names, kernel_ns=1000):
    """One replay: `names` back to back from `start`."""
    return [kernel_line(start + i * kernel_ns, start + (i + 1) * kernel_ns, graph, correlation, n)
            for i, n in enumerate(names)]


def write(path, header, lines, xz=False):
    opener = lzma.open if xz else open
    with opener(path, "wt") as f:
        f.write(header)
        f.writelines(lines)
    return str(path)


def test_the_step_graph_is_the_one_replayed_most(tmp_path):
    lines = []
    correlation = 100
    # A warm-up step graph of a larger batch: more kernels, three replays.
    for r in range(3):
        lines += replay_lines(2, correlation, 1_000_000 + r * 100_000, ["step_embed_recipe"] + ["gemv"] * 9)
        correlation += 1
    # The served step: fewer kernels, twelve replays.
    for r in range(12):
        lines += replay_lines(11, correlation, 5_000_000 + r * 100_000, ["step_embed_recipe"] + ["gemv"] * 4)
        correlation += 1
    # A codec graph replayed more often still, but not a step.
    for r in range(20):
        lines += replay_lines(7, correlation, 9_000_000 + r * 100_000, ["codec_gemm_m32"] * 3)
        correlation += 1
    rows = trace_table.read(write(tmp_path / "t.tsv.xz", KERNEL_HEADER, lines, xz=True))
    graph, size, replays = trace_table.step_replays(rows, skip=2)
    assert (graph, size, len(replays)) == (11, 5, 10)
    assert [r[0]["start_ns"] for r in replays] == [5_000_000 + r * 100_000 for r in range(2, 12)]


def test_the_host_gap_is_taken_apart_from_the_worker_calls(tmp_path):
    # Replays of 4 kernels (4 µs) every 10 µs; before each: an upload, then the graph launch.
    # The worker waits in a read-back that returns 2 µs after each replay ends.
    kernels, calls = [], []
    for r in range(4):
        start, correlation = 1_000_000 + r * 10_000, 500 + r
        kernels += replay_lines(3, correlation, start, ["step_embed_recipe", "a", "b", "c"])
        calls.append(f"api\t{start - 3_000}\t{start - 2_500}\t7\t900\tcuMemcpyHtoDAsync_v2\n")
        calls.append(f"api\t{start - 2_000}\t{start - 1_000}\t7\t{correlation}\tcuGraphLaunch\n")
        calls.append(f"api\t{start - 900}\t{start + 4_000 + 2_000}\t7\t901\tcuMemcpyDtoHAsync_v2\n")
        # Another thread's calls (the codec's) are not the worker's.
        calls.append(f"api\t{start + 4_500}\t{start + 8_000}\t9\t902\tcuLaunchKernel\n")
    rows = trace_table.read(write(tmp_path / "k.tsv", KERNEL_HEADER, kernels))
    api = serve_trace_table.read_api(write(tmp_path / "a.tsv", API_HEADER, calls))
    _, _, replays = trace_table.step_replays(rows, skip=0)
    windows = [(r[0]["start_ns"], max(k["end_ns"] for k in r)) for r in replays]
    gaps = serve_trace_table.host_gaps(api, windows, replays)
    assert len(gaps) == 3
    for gap in gaps:
        # End at +4 µs; the read-back returns at +6; the upload +7..+7.5, the launch +8..+9, the
        # next replay's first kernel at +10: 2 µs wake, 1.5 µs of the worker's own work.
        assert gap["wait_call"] == "cuMemcpyDtoHAsync_v2"
        assert gap["wake"] == 2_000
        assert gap["calls"] == {"cuMemcpyHtoDAsync_v2": 500}
        assert gap["host"] == 1_500
        assert gap["launch"] == 1_000
        assert gap["to_kernel"] == 1_000
