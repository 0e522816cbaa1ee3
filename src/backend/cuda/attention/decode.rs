//! The decode half of the attention (`attn_decode<HD>` in `kernels/attention.cu`): one or a few
//! rows of one request ([`decode`]) or one row per request, each over its own cache
//! ([`decode_rows`], the decode batch). The keys are split over CTAs (flash-decoding), each taking
//! a set of q heads of one kv head, and the last split of each (row, head set) to finish merges
//! them: one launch after the prep. No host sync; the pool requests have the same sizes every
//! step, so none reaches the driver after warm-up.

use super::{
    CTA_HEADS, GpuKvCache, Projected, check_shape, check_weights, decode_smem_bytes, prep_rows, project_and_append,
};
use crate::backend::backbone::AttentionShape;
use crate::backend::cuda::Cuda;
use crate::backend::cuda::kernel_constants::ATTN_THREADS;
use crate::backend::cuda::launch::{Arg, Dims};
use crate::backend::cuda::linear::{linear, linear_rows, linear_rows_many};
use crate::backend::cuda::memory::PoolBuf;
use crate::backend::cuda::tables::StagedTable;
use crate::backend::cuda::tensor::{GpuMatrix, GpuWeight};
use crate::model::weights::AttentionWeights;

/// Threads of the decode kernel.
const THREADS: u32 = ATTN_THREADS as u32;

/// The q heads a decode CTA takes: the largest divisor of the group (q heads per kv head) that is
/// at most `CTA_HEADS`. A row's attention spreads over `heads / cta_heads` CTAs a split.
fn cta_heads(s: &AttentionShape) -> usize {
    let group = s.heads / s.kv_heads;
    (1..=CTA_HEADS.min(group)).rev().find(|d| group.is_multiple_of(*d)).unwrap_or(1)
}

/// The decode batch's rows on the device (the kernels' `DecodeRows`): for row r, the addresses of
/// its own cache's keys and values and its position, staged for one call.
pub(in crate::backend::cuda) struct RowCaches {
    buf: StagedTable,
    rows: usize,
}

impl RowCaches {
    /// Row r's cache is `caches[r]`, its position `positions[r]`. Stages without waiting.
    pub(in crate::backend::cuda) fn stage(cuda: &Cuda, caches: &[&mut GpuKvCache], positions: &[usize]) -> RowCaches {
        let keys: Vec<u64> = caches.iter().map(|c| c.keys.ptr()).collect();
        let values: Vec<u64> = caches.iter().map(|c| c.values.ptr()).collect();
        RowCaches::stage_addrs(cuda, &keys, &values, positions)
    }

    /// Row r's cache keys at `keys[r]`, values at `values[r]` (device addresses), its position
    /// `positions[r]`. Stages without waiting.
    pub(in crate::backend::cuda) fn stage_addrs(
        cuda: &Cuda,
        keys: &[u64],
        values: &[u64],
        positions: &[usize],
    ) -> RowCaches {
        let rows = keys.len();
        assert!(values.len() == rows && positions.len() == rows, "one cache and position per row");
        let mut words: Vec<u64> = Vec::with_capacity(2 * rows + rows.div_ceil(2));
        words.extend(keys);
        words.extend(values);
        let pos: Vec<i32> = positions.iter().map(|&p| i32::try_from(p).expect("positions fit i32")).collect();
        words.extend(pos.chunks(2).map(|c| u64::from(c[0] as u32) | (u64::from(*c.get(1).unwrap_or(&0) as u32) << 32)));
        // The positions' i32 lanes follow the 2·rows address words.
        let buf = cuda.stage_table(&words, 4 * rows..5 * rows);
        RowCaches { buf, rows }
    }

    /// The kernels' three `DecodeRows` parameters.
    pub(in crate::backend::cuda) fn args(&self) -> [Arg; 3] {
        let base = self.buf.ptr();
        [base.into(), (base + 8 * self.rows as u64).into(), (base + 16 * self.rows as u64).into()]
    }
}

/// `DecodeRows` of a call that is one sequence.
pub(in crate::backend::cuda) const ONE_SEQUENCE: [Arg; 3] = [Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0)];

/// Gated attention for decode rows (one, or a few): the keys are split over `cache.splits` CTAs
/// per (head set, row), then merged. Same contract as [`prefill`](super::prefill). Makes no host sync, and its
/// pool requests have the same sizes every step (so none reaches the driver after warm-up).
pub fn decode(
    cuda: &Cuda,
    shape: &AttentionShape,
    w: &AttentionWeights<GpuWeight>,
    x: &GpuMatrix,
    cache: &mut GpuKvCache,
) -> GpuMatrix {
    let start = cache.len;
    let (qg, q) = project_and_append(cuda, shape, w, x, cache, "attention decode");
    let gated = attend_decode(cuda, shape, &q, &qg, cache, x.rows, start);
    linear(cuda, &gated, &w.o_proj)
}

/// [`decode`] of one row per request (`BackboneOps::attention_decode_rows`): the projections run
/// once over every row (`linear_rows`), the prep and the attention per row over its own cache,
/// each row exactly as [`decode`] computes it alone.
pub fn decode_rows(
    cuda: &Cuda,
    s: &AttentionShape,
    w: &AttentionWeights<GpuWeight>,
    x: &GpuMatrix,
    caches: &mut [&mut GpuKvCache],
) -> GpuMatrix {
    check_shape(s);
    check_weights(s, w, x.cols);
    let rows = caches.len();
    assert_eq!(x.rows, rows, "attention decode rows: one cache per row");
    assert!(rows > 0, "attention decode of no rows");
    for cache in caches.iter() {
        assert_eq!(cache.shape, *s, "attention decode rows: a KV cache made for another attention shape");
        assert!(cache.device_position.is_none(), "the decode batch reads host positions");
        assert!(cache.len < cache.capacity, "attention decode rows: a KV cache is full ({} positions)", cache.len);
        assert_eq!(cache.splits, caches[0].splits, "attention decode rows: caches of different capacities");
    }
    let (h, hd) = (s.heads, s.head_dim);
    let [qg, k, v]: [GpuMatrix; 3] = linear_rows_many(cuda, x, &[&w.q_proj, &w.k_proj, &w.v_proj])
        .try_into()
        .unwrap_or_else(|_| unreachable!("one output per weight"));
    let positions: Vec<usize> = caches.iter().map(|c| c.len).collect();
    let seq = RowCaches::stage(cuda, caches, &positions);
    let first = &caches[0];
    let q = prep_rows(cuda, s, w, Projected { qg: qg.ptr(), k: k.ptr(), v: v.ptr(), rows }, &seq, first);
    let gated = cuda.matrix(rows, h * hd);
    attend_decode_seq(cuda, s, q.ptr(), qg.ptr(), first, rows, 0, gated.ptr(), seq.args());
    for cache in caches.iter_mut() {
        cache.len += 1;
    }
    linear_rows(cuda, &gated, &w.o_proj)
}

/// [`attend_prefill`](super::attend_prefill)'s contract for one or a few rows: the keys split over `cache.splits` CTAs
/// per (head set, row), then merged. No host sync; pool requests of the same sizes every step.
pub(in crate::backend::cuda) fn attend_decode(
    cuda: &Cuda,
    shape: &AttentionShape,
    q: &PoolBuf,
    qg: &GpuMatrix,
    cache: &GpuKvCache,
    rows: usize,
    start: usize,
) -> GpuMatrix {
    let gated = cuda.matrix(rows, shape.heads * shape.head_dim);
    attend_decode_into(cuda, shape, q, qg.ptr(), cache, rows, start, gated.ptr());
    gated
}

/// [`attend_decode`] reading the gates at `qg` and writing the gated rows `[rows, H·HD]` at `out`.
#[allow(clippy::too_many_arguments)]
fn attend_decode_into(
    cuda: &Cuda,
    shape: &AttentionShape,
    q: &PoolBuf,
    qg: u64,
    cache: &GpuKvCache,
    rows: usize,
    start: usize,
    out: u64,
) {
    attend_decode_seq(cuda, shape, q.ptr(), qg, cache, rows, start, out, ONE_SEQUENCE);
}

/// The split decode kernel over `rows` rows (a CTA per split and set of [`cta_heads`] q heads),
/// its last split of each (row, head set) merging them
/// into `out`: of one sequence (`seq` = [`ONE_SEQUENCE`], its cache `cache` at `start`), or the
/// decode batch's (`seq` from [`RowCaches`], each row its own cache; `cache` then only gives the
/// split count).
#[allow(clippy::too_many_arguments)]
pub(in crate::backend::cuda) fn attend_decode_seq(
    cuda: &Cuda,
    shape: &AttentionShape,
    q: u64,
    qg: u64,
    cache: &GpuKvCache,
    rows: usize,
    start: usize,
    out: u64,
    seq: [Arg; 3],
) {
    let (h, hkv, hd, t, splits) = (shape.heads, shape.kv_heads, shape.head_dim, rows, cache.splits);
    let per_cta = cta_heads(shape);
    let head_sets = h / per_cta;
    let merge_counts = cuda.merge_counts.for_entries(t * head_sets);
    let part_o = cuda.scratch(t * h * splits * hd * 4);
    let part_ml = cuda.scratch(t * h * splits * 2 * 4);
    let grid = (splits as u32, head_sets as u32, t as u32);
    let dims = Dims::grid(grid, THREADS).with_shared(decode_smem_bytes(hd) as u32);
    let (counter, start) = cache.position_args(start);
    let [sk, sv, sp] = seq;
    let args = [
        q.into(),
        cache.keys.ptr().into(),
        cache.values.ptr().into(),
        part_o.ptr().into(),
        part_ml.ptr().into(),
        qg.into(),
        out.into(),
        merge_counts.into(),
        h.into(),
        hkv.into(),
        per_cta.into(),
        start.into(),
        counter.into(),
        splits.into(),
        sk,
        sv,
        sp,
    ];
    cuda.kernels.attention.variant(hd).decode.launch(cuda.stream(), dims, &args);
}
