//! `kernels/attention.cu` (prep, decode) and `kernels/attention_prefill.cu` (the prefill on tensor
//! cores): the gated full-attention mixer (`backbone.md` §2) on the GPU, with its KV cache. Same contract as the CPU oracle (`cpu::backbone::attention`): per-head [query | gate]
//! split of `q_proj`, zero-centred q/k norms, partial NeoX RoPE at positions `cache.len ..`, GQA
//! causal softmax, output · sigmoid(gate), `o_proj`. One request's rows ([`prefill`], [`decode`]),
//! one row per request (the decode batch, [`decode_rows`]), or several requests' prompt chunks in
//! one launch per kernel ([`prefill_many`], whose attention the tower's prefill shares). The
//! decode half (split keys, merged by the last split) is `attention/decode.rs`; the prompt
//! chunks of several requests `attention/segments.rs`.
//!
//! Numerics: the projections come out of `linear::linear` in bf16; q stays f32 after its norm and
//! RoPE; K (after norm and RoPE) and V are stored in a bf16 cache; scores, softmax and the weighted
//! sum are fp32 (online softmax; the prefill's MMAs take q and the probabilities as bf16 hi + lo
//! pairs, 16 significant bits, against the exact bf16 K and V); the gated output is rounded once
//! to bf16 before `o_proj`. RoPE's
//! angle is the oracle's f32 product `pos · inv_freq`, with `inv_freq` computed here on the host by
//! the oracle's own expression, so angles agree bit for bit at every position; sin/cos are f64.

use std::sync::Arc;

use cudarc::driver::CudaContext;
use half::bf16;

use super::Cuda;
use super::kernel_constants::{
    ATTN_CTA_HEADS, ATTN_MAX_SPLITS, ATTN_PREFILL_KEYS, ATTN_PREFILL_ROWS, ATTN_PREFILL_THREADS, ATTN_TILE_KEYS,
};
use super::launch::{Arg, Dims, Kernel, KernelError, Module, embedded};
use super::linear::{linear, linear_many};
use super::memory::PoolBuf;
use super::tensor::{DType, GpuMatrix, GpuWeight};
use crate::backend::backbone::AttentionShape;
use crate::model::weights::AttentionWeights;

mod decode;
mod merge_counts;
mod segments;
pub(super) use decode::{ONE_SEQUENCE, RowCaches, attend_decode, attend_decode_seq};
pub use decode::{decode, decode_rows};
pub use merge_counts::{MERGE_COUNTS, MergeCounts, merge_counts_left};
pub use segments::prefill_many;
pub(super) use segments::{PrefillSegments, attend_prefill_segments, first_rows};

/// Threads of a prefill CTA, its query rows (16 a warp) and keys per tile.
const PREFILL_THREADS: u32 = ATTN_PREFILL_THREADS as u32;
const PREFILL_ROWS: usize = ATTN_PREFILL_ROWS;
const PREFILL_KEYS: usize = ATTN_PREFILL_KEYS;
/// Keys per shared-memory tile of the decode kernel.
const TILE_KEYS: usize = ATTN_TILE_KEYS;
/// Most q heads (of one kv head) a decode CTA takes.
const CTA_HEADS: usize = ATTN_CTA_HEADS;
/// Decode splits the keys over at most this many CTAs per (head set, row) (flash-decoding) ...
const MAX_SPLITS: usize = ATTN_MAX_SPLITS;
/// ... and over one more per this many positions of cache capacity (so a full 16k cache is read
/// by 64 CTAs per head set, each streaming 256 keys).
const KEYS_PER_SPLIT: usize = 64;
/// Head dims with a compiled prefill/decode kernel.
const HEAD_DIMS: [usize; 4] = [32, 64, 128, 256];
/// Dynamic shared memory of `attn_prefill_mma<HD>` (kernels/attention_prefill.cu): Q as hi and lo
/// halves, one K and one V tile, bf16 rows padded by 8.
fn prefill_smem_bytes(hd: usize) -> usize {
    2 * (2 * PREFILL_ROWS + 2 * PREFILL_KEYS) * (hd + 8)
}

/// Dynamic shared memory of `attn_decode<HD>` (Qs, Ks, Vs, Ps, three head statistics).
fn decode_smem_bytes(hd: usize) -> usize {
    4 * (CTA_HEADS * hd + TILE_KEYS * (hd + 4) + TILE_KEYS * hd + CTA_HEADS * TILE_KEYS + 3 * CTA_HEADS)
}

/// The kernels of one head dim. The prefill kernel's shared memory (132 KiB at head_dim 256) is
/// more than some GPUs grant a block; that is reported when prefill is used, not at start-up.
struct Variant {
    head_dim: usize,
    prefill: Kernel,
    prefill_ready: Result<(), String>,
    decode: Kernel,
}

pub struct AttentionKernels {
    prep: Kernel,
    variants: Vec<Variant>,
}

impl AttentionKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<AttentionKernels, KernelError> {
        let m = Module::load_overlapping(ctx, "attention", embedded::ATTENTION)?;
        let pm = Module::load_overlapping(ctx, "attention_prefill", embedded::ATTENTION_PREFILL)?;
        let names = [
            ("attn_prefill_hd32", "attn_decode_hd32"),
            ("attn_prefill_hd64", "attn_decode_hd64"),
            ("attn_prefill_hd128", "attn_decode_hd128"),
            ("attn_prefill_hd256", "attn_decode_hd256"),
        ];
        let mut variants = Vec::new();
        for (&head_dim, (prefill_name, decode_name)) in HEAD_DIMS.iter().zip(names) {
            let prefill = pm.kernel(prefill_name)?;
            let smem = prefill_smem_bytes(head_dim);
            let prefill_ready = prefill.allow_shared_bytes(smem as u32).map_err(|e| {
                format!("attention prefill at head_dim {head_dim} needs {smem} bytes of shared memory per block: {e}")
            });
            let decode = m.kernel_with_shared(decode_name, decode_smem_bytes(head_dim))?;
            variants.push(Variant { head_dim, prefill, prefill_ready, decode });
        }
        Ok(AttentionKernels { prep: m.kernel("attn_prep")?, variants })
    }

    fn variant(&self, head_dim: usize) -> &Variant {
        self.variants
            .iter()
            .find(|v| v.head_dim == head_dim)
            .unwrap_or_else(|| panic!("attention head_dim {head_dim} has no GPU kernel (compiled: {HEAD_DIMS:?})"))
    }
}

/// Keys (after k_norm and RoPE) and raw values of every position so far, bf16,
/// `[capacity, kv_heads, head_dim]` each (the CPU `KvCache` layout; positions `len..` are unset),
/// plus the RoPE frequency table of its shape.
pub struct GpuKvCache {
    pub keys: PoolBuf,
    pub values: PoolBuf,
    /// `inv_freq[i]` for `i < rotary_dim / 2`, f32.
    pub(super) inv_freq: PoolBuf,
    shape: AttentionShape,
    /// Decode splits, fixed per cache so the decode grid does not depend on `len`.
    pub(super) splits: usize,
    pub len: usize,
    pub capacity: usize,
    /// Set while a captured step is recorded: decode positions come from device memory.
    device_position: Option<DevicePosition>,
}

/// A position counter in device memory (an `i32`) and this cache's offset from it: while a cache
/// follows one, decode rows go to position `*counter + offset` instead of `len`, so a captured
/// CUDA graph replays frame after frame with the positions advancing on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePosition {
    /// Device address of the `i32` counter.
    pub counter: u64,
    pub offset: usize,
}

impl GpuKvCache {
    /// Makes decode calls read their position from `position` (`None`: from `len` again). Host
    /// `len` bookkeeping goes on as before, and is the caller's to correct after graph replays.
    pub fn follow_device_position(&mut self, position: Option<DevicePosition>) {
        self.device_position = position;
    }

    /// `(device counter address or 0, start or offset)`: the kernels' position arguments for a
    /// call whose host-side first position is `start`.
    pub(super) fn position_args(&self, start: usize) -> (u64, usize) {
        match self.device_position {
            Some(p) => (p.counter, p.offset),
            None => (0, start),
        }
    }

    /// Bytes of one position's keys (and of its values): `kv_heads · head_dim` bf16.
    pub fn position_bytes(&self) -> usize {
        self.shape.kv_heads * self.shape.head_dim * size_of::<bf16>()
    }

    /// The first `len` positions' keys as f32, `[len, kv_heads, head_dim]` (for checks: syncs).
    pub fn keys_to_host(&self, cuda: &Cuda) -> Vec<f32> {
        self.to_host(cuda, &self.keys)
    }

    /// The first `len` positions' values as f32, `[len, kv_heads, head_dim]` (for checks: syncs).
    pub fn values_to_host(&self, cuda: &Cuda) -> Vec<f32> {
        self.to_host(cuda, &self.values)
    }

    fn to_host(&self, cuda: &Cuda, buf: &PoolBuf) -> Vec<f32> {
        let n = self.len * self.shape.kv_heads * self.shape.head_dim;
        if n == 0 {
            return Vec::new();
        }
        cuda.copy_to_host::<bf16>(buf.ptr(), n).iter().map(|v| v.to_f32()).collect()
    }

    /// Replaces the contents with given positions (rounded to bf16), in the layout of
    /// [`GpuKvCache::keys_to_host`]: lets checks start decode deep into a long context. Syncs.
    pub fn load_from_host(&mut self, cuda: &Cuda, keys: &[f32], values: &[f32]) {
        let row = self.shape.kv_heads * self.shape.head_dim;
        assert!(keys.len() == values.len() && keys.len().is_multiple_of(row), "KV cache contents of mismatched sizes");
        let len = keys.len() / row;
        assert!(len <= self.capacity, "{len} positions do not fit a KV cache of capacity {}", self.capacity);
        if len > 0 {
            cuda.copy_to_device(self.keys.ptr(), &super::tensor::to_bf16_vec(keys));
            cuda.copy_to_device(self.values.ptr(), &super::tensor::to_bf16_vec(values));
        }
        self.len = len;
    }
}

/// RoPE's inverse frequency `i`, by the CPU oracle's expression (`cpu::backbone::rope`): f32 powf.
fn inv_freq(i: usize, rot: usize, theta: f64) -> f32 {
    1.0f32 / (theta as f32).powf((2 * i) as f32 / rot as f32)
}

/// An empty cache for `capacity` positions, from the pool (call before decoding: it uploads the
/// frequency table, which syncs).
pub fn new_cache(cuda: &Cuda, shape: &AttentionShape, capacity: usize) -> GpuKvCache {
    let half = shape.rotary_dim / 2;
    // One dummy entry when nothing rotates: the table is never read then.
    let table: Vec<f32> = (0..half.max(1)).map(|i| inv_freq(i, shape.rotary_dim.max(2), shape.rope_theta)).collect();
    new_cache_with_rope_table(cuda, shape, capacity, &table)
}

/// [`new_cache`] with a caller's RoPE frequency table (the tower computes its own, by its oracle's
/// expression).
pub(super) fn new_cache_with_rope_table(
    cuda: &Cuda,
    shape: &AttentionShape,
    capacity: usize,
    table: &[f32],
) -> GpuKvCache {
    check_shape(shape);
    assert!(capacity > 0, "a KV cache needs room for at least one position");
    let bytes = capacity * shape.kv_heads * shape.head_dim * 2;
    GpuKvCache {
        keys: cuda.scratch(bytes),
        values: cuda.scratch(bytes),
        inv_freq: cuda.upload_f32_scratch(table),
        shape: *shape,
        splits: capacity.div_ceil(KEYS_PER_SPLIT).clamp(1, MAX_SPLITS),
        len: 0,
        capacity,
        device_position: None,
    }
}

pub(super) fn check_shape(s: &AttentionShape) {
    assert!(s.kv_heads > 0 && s.heads.is_multiple_of(s.kv_heads), "{} q heads over {} kv heads", s.heads, s.kv_heads);
    assert!(
        s.rotary_dim.is_multiple_of(2) && s.rotary_dim <= s.head_dim,
        "rotary_dim {} must be even and at most head_dim {}",
        s.rotary_dim,
        s.head_dim
    );
    assert!(HEAD_DIMS.contains(&s.head_dim), "attention head_dim {} has no GPU kernel ({HEAD_DIMS:?})", s.head_dim);
}

fn check_weights(s: &AttentionShape, w: &AttentionWeights<GpuWeight>, hidden: usize) {
    let (h, hkv, hd) = (s.heads, s.kv_heads, s.head_dim);
    for (name, m, rows, cols) in [
        ("q_proj", &w.q_proj, 2 * h * hd, hidden),
        ("k_proj", &w.k_proj, hkv * hd, hidden),
        ("v_proj", &w.v_proj, hkv * hd, hidden),
        ("o_proj", &w.o_proj, hidden, h * hd),
    ] {
        assert_eq!(m.matrix_dims(), (rows, cols), "attention {name} shape");
    }
    for (name, g) in [("q_norm", &w.q_norm), ("k_norm", &w.k_norm)] {
        assert_eq!(g.dtype, DType::F32, "attention {name} must be resident as f32");
        assert_eq!(g.numel(), hd, "attention {name} width");
    }
}

/// The projections, and the prep kernel: q (normed, rotated, scaled) in f32 scratch, this call's
/// K/V appended to the cache. Returns (qg, q); `cache.len` has advanced by `x.rows`.
fn project_and_append(
    cuda: &Cuda,
    s: &AttentionShape,
    w: &AttentionWeights<GpuWeight>,
    x: &GpuMatrix,
    cache: &mut GpuKvCache,
    what: &str,
) -> (GpuMatrix, PoolBuf) {
    check_shape(s);
    check_weights(s, w, x.cols);
    let [qg, k, v]: [GpuMatrix; 3] = linear_many(cuda, x, &[&w.q_proj, &w.k_proj, &w.v_proj])
        .try_into()
        .unwrap_or_else(|_| unreachable!("one output per weight"));
    let q = prep(cuda, s, w, Projected { qg: qg.ptr(), k: k.ptr(), v: v.ptr(), rows: x.rows }, cache, what);
    (qg, q)
}

/// Device addresses of `rows` consecutive projected rows: q|gate `[rows, 2·H·HD]`, k and v
/// `[rows, Hkv·HD]` (bf16).
struct Projected {
    qg: u64,
    k: u64,
    v: u64,
    rows: usize,
}

/// The prep kernel over projected rows at `cache.len ..`: q (normed, rotated, scaled by
/// `log2(e)/√HD`) into f32 scratch `[rows, H, HD]`, K/V normed, rotated and appended to the cache.
fn prep(
    cuda: &Cuda,
    s: &AttentionShape,
    w: &AttentionWeights<GpuWeight>,
    p: Projected,
    cache: &mut GpuKvCache,
    what: &str,
) -> PoolBuf {
    assert_eq!(cache.shape, *s, "{what}: the KV cache was made for another attention shape");
    assert!(p.rows > 0, "{what} of no rows");
    assert!(
        cache.len + p.rows <= cache.capacity,
        "{what}: {} positions + {} rows exceed the KV cache capacity {}",
        cache.len,
        p.rows,
        cache.capacity
    );
    let (counter, start) = cache.position_args(cache.len);
    let rows = p.rows;
    let q = launch_prep(cuda, s, w, p, cache, start, counter, ONE_SEQUENCE);
    cache.len += rows;
    q
}

/// The prep kernel with every row in its own cache at its own position (`rows`, from
/// [`RowCaches`]); `first` gives the RoPE table. The caller advances the caches' lengths.
fn prep_rows(
    cuda: &Cuda,
    s: &AttentionShape,
    w: &AttentionWeights<GpuWeight>,
    p: Projected,
    rows: &RowCaches,
    first: &GpuKvCache,
) -> PoolBuf {
    launch_prep(cuda, s, w, p, first, 0, 0, rows.args())
}

/// One launch of the prep kernel: RoPE from `table`'s inverse frequencies; K/V into `table`'s
/// cache at `start` (or the position counter at `counter`), unless `rows` gives each row its own
/// cache and position. Returns q, f32 `[rows, H, HD]`, scaled by `log2(e)/√HD`.
#[allow(clippy::too_many_arguments)]
fn launch_prep(
    cuda: &Cuda,
    s: &AttentionShape,
    w: &AttentionWeights<GpuWeight>,
    p: Projected,
    table: &GpuKvCache,
    start: usize,
    counter: u64,
    rows: [Arg; 3],
) -> PoolBuf {
    let (h, hkv, hd) = (s.heads, s.kv_heads, s.head_dim);
    let q = cuda.scratch(p.rows * h * hd * 4);
    // Scores come out in log2 units: the softmax uses exp2.
    let q_scale = (std::f64::consts::LOG2_E / (hd as f64).sqrt()) as f32;
    let [sk, sv, sp] = rows;
    let args = [
        p.qg.into(),
        p.k.into(),
        p.v.into(),
        w.q_norm.ptr.into(),
        w.k_norm.ptr.into(),
        table.inv_freq.ptr().into(),
        q.ptr().into(),
        table.keys.ptr().into(),
        table.values.ptr().into(),
        h.into(),
        hkv.into(),
        s.rotary_dim.into(),
        start.into(),
        counter.into(),
        (s.norm_eps as f32).into(),
        q_scale.into(),
        sk,
        sv,
        sp,
    ];
    let dims = Dims::grid(((h + hkv) as u32, p.rows as u32, 1), hd as u32);
    cuda.kernels.attention.prep.launch(cuda.stream(), dims, &args);
    q
}

/// Gated attention over `x`'s rows at positions `cache.len ..` (causal within the call and over
/// the cache), appending their keys and values. Returns the `o_proj` output.
///
/// # Panics
/// If the rows would not fit the cache's capacity, or shapes disagree.
pub fn prefill(
    cuda: &Cuda,
    shape: &AttentionShape,
    w: &AttentionWeights<GpuWeight>,
    x: &GpuMatrix,
    cache: &mut GpuKvCache,
) -> GpuMatrix {
    let start = cache.len;
    let (qg, q) = project_and_append(cuda, shape, w, x, cache, "attention prefill");
    let gated = attend_prefill(cuda, shape, &q, &qg, cache, x.rows, start);
    linear(cuda, &gated, &w.o_proj)
}

/// Causal GQA attention of `rows` prepared query rows at positions `start ..` over `cache`
/// (which already holds their keys), for many rows at once: `q` f32 `[rows, H, HD]` normed,
/// rotated and scaled by `scale·log2(e)`; `qg` bf16 `[rows, H·2·HD]` of which only each head's
/// gate half is read. Returns the gated output `[rows, H·HD]` bf16 (what `o_proj` reads).
pub(super) fn attend_prefill(
    cuda: &Cuda,
    shape: &AttentionShape,
    q: &PoolBuf,
    qg: &GpuMatrix,
    cache: &GpuKvCache,
    rows: usize,
    start: usize,
) -> GpuMatrix {
    let (h, hkv, hd) = (shape.heads, shape.kv_heads, shape.head_dim);
    assert!(cache.device_position.is_none(), "prefill attention reads host positions only (not capturable)");
    let variant = cuda.kernels.attention.variant(hd);
    if let Err(why) = &variant.prefill_ready {
        panic!("{why}");
    }
    let gated = cuda.matrix(rows, h * hd);
    let rows_per_kv_head = rows * (h / hkv);
    let dims = Dims::grid((rows_per_kv_head.div_ceil(PREFILL_ROWS) as u32, hkv as u32, 1), PREFILL_THREADS)
        .with_shared(prefill_smem_bytes(hd) as u32);
    let args = [
        q.ptr().into(),
        qg.ptr().into(),
        cache.keys.ptr().into(),
        cache.values.ptr().into(),
        gated.ptr().into(),
        rows.into(),
        h.into(),
        hkv.into(),
        start.into(),
        0u64.into(),
    ];
    variant.prefill.launch(cuda.stream(), dims, &args);
    gated
}
