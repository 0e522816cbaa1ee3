//! Several requests' prompt chunks in one launch per kernel (`BackboneOps::attention_prefill_many`):
//! the projections as one row-invariant GEMM (`linear_segments`), the prep over every row into
//! its own request's cache, and the attention with each request's rows in their own CTAs. The
//! tower's prefill shares [`attend_prefill_segments`].

use super::{
    GpuKvCache, PREFILL_ROWS, PREFILL_THREADS, Projected, RowCaches, check_shape, check_weights, prefill_smem_bytes,
    prep_rows,
};
use crate::backend::backbone::AttentionShape;
use crate::backend::cuda::Cuda;
use crate::backend::cuda::launch::Dims;
use crate::backend::cuda::linear::linear_segments;
use crate::backend::cuda::tensor::{GpuMatrix, GpuWeight};
use crate::model::weights::AttentionWeights;

/// Several requests' query rows for [`attend_prefill_segments`]: request i's `lens[i]` rows,
/// from row `firsts[i]` of q, qg and the output, at positions `starts[i]..` of `caches[i]`,
/// which already holds their keys.
pub(in crate::backend::cuda) struct PrefillSegments<'a> {
    pub caches: &'a [&'a GpuKvCache],
    pub firsts: &'a [usize],
    pub lens: &'a [usize],
    pub starts: &'a [usize],
}

/// The first row of each of consecutive runs of `lens` rows.
pub(in crate::backend::cuda) fn first_rows(lens: &[usize]) -> Vec<usize> {
    lens.iter()
        .scan(0, |next, &n| {
            let first = *next;
            *next += n;
            Some(first)
        })
        .collect()
}

/// [`attend_prefill`](super::attend_prefill) of several requests in one launch (grid.z = requests): q (f32
/// `[rows, H, HD]`) and qg (bf16 `[rows, H·2·HD]`) at device addresses, the gated rows written at
/// `out`. Each request's rows get exactly what [`attend_prefill`](super::attend_prefill) gives them alone.
pub(in crate::backend::cuda) fn attend_prefill_segments(
    cuda: &Cuda,
    shape: &AttentionShape,
    q: u64,
    qg: u64,
    segments: &PrefillSegments<'_>,
    out: u64,
) {
    let (h, hkv, hd) = (shape.heads, shape.kv_heads, shape.head_dim);
    let PrefillSegments { caches, firsts, lens, starts } = *segments;
    let requests = lens.len();
    assert!(
        caches.len() == requests && firsts.len() == requests && starts.len() == requests,
        "one cache, first row, length and start per request"
    );
    let Some(&most) = lens.iter().max() else { return };
    let variant = cuda.kernels.attention.variant(hd);
    if let Err(why) = &variant.prefill_ready {
        panic!("{why}");
    }
    // Per request: [keys, values, first row, rows, first position].
    let mut seqs: Vec<u64> = Vec::with_capacity(5 * requests);
    for i in 0..requests {
        let (cache, n, start) = (caches[i], lens[i], starts[i]);
        assert!(cache.device_position.is_none(), "prefill attention reads host positions only (not capturable)");
        assert!(start + n <= cache.len, "prefill attention: the cache must hold the rows' keys");
        seqs.extend([cache.keys.ptr(), cache.values.ptr(), firsts[i] as u64, n as u64, start as u64]);
    }
    let table = cuda.scratch(seqs.len() * 8);
    cuda.stage_to_device(table.ptr(), &seqs);
    let blocks = (most * (h / hkv)).div_ceil(PREFILL_ROWS);
    let dims = Dims::grid((blocks as u32, hkv as u32, lens.len() as u32), PREFILL_THREADS)
        .with_shared(prefill_smem_bytes(hd) as u32);
    let first = caches[0];
    let args = [
        q.into(),
        qg.into(),
        first.keys.ptr().into(),
        first.values.ptr().into(),
        out.into(),
        0usize.into(),
        h.into(),
        hkv.into(),
        0usize.into(),
        table.ptr().into(),
    ];
    variant.prefill.launch(cuda.stream(), dims, &args);
}

/// [`prefill`](super::prefill) of several requests' prompt chunks at once (`BackboneOps::attention_prefill_many`):
/// `lens[i]` consecutive rows of `x` continue `caches[i]`. The projections give each request's
/// rows what [`linear`](crate::backend::cuda::linear::linear) gives them alone, in one launch for all (`linear_segments`); the prep runs
/// once over every row, each row into its own request's cache at its own position; the attention
/// once, each request's rows in their own CTAs (grid.z). Every request's rows and cache are bit
/// for bit what [`prefill`](super::prefill) gives them alone.
///
/// # Panics
/// If a request's rows would not fit its cache, or shapes disagree.
pub fn prefill_many(
    cuda: &Cuda,
    s: &AttentionShape,
    w: &AttentionWeights<GpuWeight>,
    x: &GpuMatrix,
    lens: &[usize],
    caches: &mut [&mut GpuKvCache],
) -> GpuMatrix {
    check_shape(s);
    check_weights(s, w, x.cols);
    assert_eq!(lens.len(), caches.len(), "attention prefill: one cache per request");
    assert!(lens.iter().all(|&n| n > 0), "attention prefill of a request with no rows");
    assert_eq!(lens.iter().sum::<usize>(), x.rows, "attention prefill: the requests' rows cover x");
    for (cache, &n) in caches.iter().zip(lens) {
        assert_eq!(cache.shape, *s, "attention prefill: a KV cache made for another attention shape");
        assert!(cache.device_position.is_none(), "prefill attention reads host positions only (not capturable)");
        assert!(
            cache.len + n <= cache.capacity,
            "attention prefill: {} positions + {n} rows exceed the KV cache capacity {}",
            cache.len,
            cache.capacity
        );
    }
    let (h, hd) = (s.heads, s.head_dim);
    let qg = linear_segments(cuda, x, lens, &w.q_proj);
    let k = linear_segments(cuda, x, lens, &w.k_proj);
    let v = linear_segments(cuda, x, lens, &w.v_proj);

    // Row r of request i: its cache, at position len_i + (r − first row of i).
    let (mut keys, mut values, mut positions) = (Vec::new(), Vec::new(), Vec::new());
    for (cache, &n) in caches.iter().zip(lens) {
        keys.extend(std::iter::repeat_n(cache.keys.ptr(), n));
        values.extend(std::iter::repeat_n(cache.values.ptr(), n));
        positions.extend(cache.len..cache.len + n);
    }
    let rows = RowCaches::stage_addrs(cuda, &keys, &values, &positions);
    let q = prep_rows(cuda, s, w, Projected { qg: qg.ptr(), k: k.ptr(), v: v.ptr(), rows: x.rows }, &rows, caches[0]);

    let starts: Vec<usize> = caches.iter().map(|c| c.len).collect();
    for (cache, &n) in caches.iter_mut().zip(lens) {
        cache.len += n;
    }
    let gated = cuda.matrix(x.rows, h * hd);
    let views: Vec<&GpuKvCache> = caches.iter().map(|c| &**c).collect();
    let firsts = first_rows(lens);
    let segments = PrefillSegments { caches: &views, firsts: &firsts, lens, starts: &starts };
    attend_prefill_segments(cuda, s, q.ptr(), qg.ptr(), &segments, gated.ptr());
    linear_segments(cuda, &gated, lens, &w.o_proj)
}
