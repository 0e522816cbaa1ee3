//! `kernels/tower.cu` and `TowerOps` on the GPU: the Codebook-MTP tower layer (`model.md` §6)
//! from the tower's own kernels (unseen-codes sum, the enorm/hnorm mix, the q/k norm + interleaved
//! RoPE + cache write), the shared projections, norms and SwiGLU, and the backbone's attention
//! kernels over each layer's own KV cache. One request's rows, one row per request (the decode
//! batch), or several requests' prompt rows in one launch per kernel (the prompts' prefill).
//!
//! Numerics follow the backbone's: bf16 activations between operations, f32 inside them, keys
//! and values in bf16 caches; q stays f32 after its norm and RoPE; head logits come out in bf16.

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::attention::{self, GpuKvCache, PrefillSegments, RowCaches};
use super::launch::{Arg, Dims, Kernel, KernelError, Module, embedded};
use super::linear::{self, linear, linear_many, linear_rows, linear_rows_many, linear_segments};
use super::memory::PoolBuf;
use super::tensor::{GpuMatrix, GpuWeight};
use super::{Cuda, moe, norm};
use crate::backend::backbone::AttentionShape;
use crate::backend::cpu::Matrix;
use crate::backend::tower::{
    TowerError, TowerLayerInput, TowerManyInput, TowerOps, TowerRowsInput, TowerShape, UnseenCodes,
};
use crate::model::weights::TowerLayer;

pub struct TowerKernels {
    unseen: Kernel,
    mix: Kernel,
    prep: Kernel,
}

impl TowerKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<TowerKernels, KernelError> {
        let m = Module::load_overlapping(ctx, "tower", embedded::TOWER)?;
        Ok(TowerKernels {
            unseen: m.kernel("tower_unseen")?,
            mix: m.kernel("tower_mix")?,
            prep: m.kernel("tower_prep")?,
        })
    }
}

const THREADS: u32 = 256;
/// Rows up to this many take the split-key decode attention; more take the prefill kernel.
const DECODE_ROWS: usize = 4;

/// One tower layer's K/V cache, indexed by backbone position (capacity: the backend's context).
pub struct GpuTowerKv {
    pub cache: GpuKvCache,
}

/// The attention shape the backbone's attention kernels take, for a tower layer.
fn attention_shape(s: &TowerShape) -> AttentionShape {
    AttentionShape {
        heads: s.heads,
        kv_heads: s.kv_heads,
        head_dim: s.head_dim,
        rotary_dim: s.rotary_dim,
        rope_theta: s.rope_base,
        norm_eps: s.norm_eps,
    }
}

/// The interleaved RoPE's inverse frequencies, by the CPU oracle's expression
/// (`cpu::tower::kernels::rope_interleaved`): `base^(−2i/rotary_dim)` in f64, rounded to f32.
fn inv_freq_table(s: &TowerShape) -> Vec<f32> {
    let pairs = (s.rotary_dim / 2).max(1);
    (0..pairs).map(|i| s.rope_base.powf(-((2 * i) as f64) / s.rotary_dim.max(2) as f64) as f32).collect()
}

/// Host values as u32 in a pool buffer, queued without a sync (small per-call recipes).
fn stage_u32(cuda: &Cuda, values: &[u32]) -> PoolBuf {
    let buf = cuda.scratch(values.len().max(1) * 4);
    if !values.is_empty() {
        cuda.stage_to_device(buf.ptr(), values);
    }
    buf
}

fn flags(values: &[bool]) -> Vec<u32> {
    values.iter().map(|&b| u32::from(b)).collect()
}

impl TowerOps for Cuda {
    type TowerKv = GpuTowerKv;

    fn tower_kv(&self, shape: &TowerShape) -> GpuTowerKv {
        let table = inv_freq_table(shape);
        GpuTowerKv {
            cache: attention::new_cache_with_rope_table(self, &attention_shape(shape), self.context(), &table),
        }
    }

    fn tower_kv_len(&self, kv: &GpuTowerKv) -> usize {
        kv.cache.len
    }

    fn tower_unseen(&self, table: &GpuWeight, s: &TowerShape, u: &UnseenCodes<'_>) -> GpuMatrix {
        let n = u.row_semantic.len();
        assert_eq!(u.codes.len(), n * u.codebooks, "unseen codes are [rows, codebooks]");
        assert_eq!(table.matrix_dims(), (u.codebooks * s.codebook_vocab, s.dim), "codebook embedding table shape");
        if n == 0 {
            return self.matrix(0, s.dim);
        }
        let codes = stage_u32(self, u.codes);
        let semantic = stage_u32(self, &flags(u.row_semantic));
        let device =
            DeviceUnseen { codes: codes.ptr(), semantic: semantic.ptr(), codebooks: u.codebooks, first: u.first };
        self.tower_unseen_device(table, s, device, n)
    }

    fn tower_layer(
        &self,
        s: &TowerShape,
        w: &TowerLayer<GpuWeight>,
        kv: &mut GpuTowerKv,
        input: TowerLayerInput<'_, GpuMatrix>,
    ) -> Result<GpuMatrix, TowerError> {
        let hidden = (input.hidden.rows, input.hidden.cols);
        input.check(s, hidden, input.unseen.map(|u| u.rows), kv.cache.len)?;
        let codes = stage_u32(self, input.codes);
        let mask = stage_u32(self, &flags(input.label_semantic));
        let labels = DeviceLabels { codes: codes.ptr(), mask: mask.ptr(), stride: 1 };
        let device = DeviceLayerInput { hidden: input.hidden, labels, unseen: input.unseen, start: input.start };
        Ok(self.tower_layer_device(s, w, kv, device))
    }

    fn tower_head(&self, head: &GpuWeight, hidden: &GpuMatrix) -> GpuMatrix {
        linear(self, hidden, head)
    }

    fn tower_layer_rows(
        &self,
        s: &TowerShape,
        w: &TowerLayer<GpuWeight>,
        kvs: &mut [&mut GpuTowerKv],
        input: TowerRowsInput<'_, GpuMatrix>,
    ) -> Result<GpuMatrix, TowerError> {
        self.tower_layer_batch(s, w, kvs, input)
    }

    fn tower_layer_many(
        &self,
        s: &TowerShape,
        w: &TowerLayer<GpuWeight>,
        kvs: &mut [&mut GpuTowerKv],
        input: TowerManyInput<'_, GpuMatrix>,
    ) -> Result<GpuMatrix, TowerError> {
        self.tower_layer_segments(s, w, kvs, input)
    }

    fn tower_head_rows(&self, head: &GpuWeight, hidden: &GpuMatrix) -> GpuMatrix {
        linear_rows(self, hidden, head)
    }

    fn tower_act_shape(&self, a: &GpuMatrix) -> (usize, usize) {
        (a.rows, a.cols)
    }

    fn tower_act_host(&self, a: &GpuMatrix) -> Vec<f32> {
        let Matrix { data, .. } = crate::backend::BackendTypes::to_host(self, a);
        data
    }
}

/// Device addresses of a tower layer's labels: one `u32` code and one `u32` mask flag (nonzero =
/// semantic) per row, row r's at `r · stride` words on, e.g. words of the GPU sampler's rows.
#[derive(Clone, Copy, Debug)]
pub struct DeviceLabels {
    pub codes: u64,
    pub mask: u64,
    /// `u32` words from one row's code (and flag) to the next: 1 for packed arrays.
    pub stride: usize,
}

/// [`UnseenCodes`] on the device: `[rows, codebooks]` `u32` codes and one `u32` "row is
/// semantic" flag per row.
#[derive(Clone, Copy, Debug)]
pub struct DeviceUnseen {
    pub codes: u64,
    pub semantic: u64,
    pub codebooks: usize,
    /// First codebook summed.
    pub first: usize,
}

/// [`TowerLayerInput`] with its labels on the device.
pub struct DeviceLayerInput<'a> {
    /// `[n, dim]`.
    pub hidden: &'a GpuMatrix,
    pub labels: DeviceLabels,
    /// `[n, dim]` (layer 0 only).
    pub unseen: Option<&'a GpuMatrix>,
    /// Position of the first row (for decode rows, ignored while the cache follows a device position).
    pub start: usize,
}

/// [`TowerRowsInput`] with its labels on the device.
pub struct DeviceRowsInput<'a> {
    /// `[n, dim]`: one row per request.
    pub hidden: &'a GpuMatrix,
    pub labels: DeviceLabels,
    /// `[n, dim]` (layer 0 only).
    pub unseen: Option<&'a GpuMatrix>,
    /// The position each row is written at in its own cache.
    pub starts: &'a [usize],
}

impl Cuda {
    /// [`TowerOps::tower_layer`] with its labels already on the device (no host data, no sync:
    /// capturable).
    ///
    /// # Panics
    /// If the rows would not fit the cache, or shapes disagree.
    pub fn tower_layer_device(
        &self,
        s: &TowerShape,
        w: &TowerLayer<GpuWeight>,
        kv: &mut GpuTowerKv,
        input: DeviceLayerInput<'_>,
    ) -> GpuMatrix {
        let DeviceLayerInput { hidden, labels, unseen, start } = input;
        let cache = &mut kv.cache;
        let n = hidden.rows;
        assert!(
            start + n <= cache.capacity,
            "tower: {start} positions + {n} rows exceed the KV cache capacity {}",
            cache.capacity
        );
        self.layer_with(s, w, hidden, labels, unseen, &|x, m| linear_many(self, x, m), &mut |qkv| {
            self.attend(s, w, qkv, cache, start)
        })
    }

    /// [`TowerOps::tower_layer_rows`]: one row per request, each at its own position of its own
    /// cache. The mix, projections, norms and SwiGLU run once over every row (`linear_rows`), the
    /// attention per row, each row exactly as [`Cuda::tower_layer_device`] computes it alone.
    fn tower_layer_batch(
        &self,
        s: &TowerShape,
        w: &TowerLayer<GpuWeight>,
        kvs: &mut [&mut GpuTowerKv],
        input: TowerRowsInput<'_, GpuMatrix>,
    ) -> Result<GpuMatrix, TowerError> {
        let n = kvs.len();
        for (r, kv) in kvs.iter().enumerate() {
            let start = input.starts[r];
            if start > kv.cache.len {
                return Err(TowerError::PositionGap { start, cached: kv.cache.len });
            }
            assert!(start < kv.cache.capacity, "tower: position {start} past the KV cache capacity");
        }
        let check =
            |what, found| if found == n { Ok(()) } else { Err(TowerError::Length { what, expected: n, found }) };
        check("hidden rows", input.hidden.rows)?;
        check("codes", input.codes.len())?;
        check("label mask", input.label_semantic.len())?;
        check("positions", input.starts.len())?;
        let codes = stage_u32(self, input.codes);
        let mask = stage_u32(self, &flags(input.label_semantic));
        let labels = DeviceLabels { codes: codes.ptr(), mask: mask.ptr(), stride: 1 };
        let device = DeviceRowsInput { hidden: input.hidden, labels, unseen: input.unseen, starts: input.starts };
        Ok(self.tower_layer_rows_device(s, w, kvs, device))
    }

    /// [`TowerOps::tower_layer_rows`] with its labels already on the device (e.g. the rows the
    /// GPU sampler just drew: no read-back between the head draws and the next layer).
    ///
    /// # Panics
    /// If a row's position leaves a gap in or lies past its cache, or the counts disagree.
    pub fn tower_layer_rows_device(
        &self,
        s: &TowerShape,
        w: &TowerLayer<GpuWeight>,
        kvs: &mut [&mut GpuTowerKv],
        input: DeviceRowsInput<'_>,
    ) -> GpuMatrix {
        let n = kvs.len();
        assert_eq!(input.hidden.rows, n, "tower rows: hidden rows per cache");
        assert_eq!(input.starts.len(), n, "tower rows: positions per cache");
        for (kv, &start) in kvs.iter().zip(input.starts) {
            assert!(start <= kv.cache.len, "tower: position {start} leaves a gap after {}", kv.cache.len);
            assert!(start < kv.cache.capacity, "tower: position {start} past the KV cache capacity");
        }
        let mut attend = |qkv: &GpuMatrix| self.attend_rows(s, w, qkv, kvs, input.starts);
        self.layer_with(
            s,
            w,
            input.hidden,
            input.labels,
            input.unseen,
            &|x, m| linear_rows_many(self, x, m),
            &mut attend,
        )
    }

    /// [`TowerOps::tower_layer_many`]: several requests' teacher-forced rows. The mix, norms and
    /// SwiGLU run once over every row; the projections once, each request's rows getting what
    /// [`linear`] gives them alone (`linear_segments`); the q/k prep once, each row into its own
    /// request's cache; the attention of every request longer than the split decode's rows in
    /// one launch (the others alone, as [`Cuda::attend`] takes them). Each request's rows and
    /// cache are bit for bit those of [`TowerOps::tower_layer`] alone.
    fn tower_layer_segments(
        &self,
        s: &TowerShape,
        w: &TowerLayer<GpuWeight>,
        kvs: &mut [&mut GpuTowerKv],
        input: TowerManyInput<'_, GpuMatrix>,
    ) -> Result<GpuMatrix, TowerError> {
        let TowerManyInput { hidden, codes, label_semantic, unseen, starts, lens } = input;
        let n = kvs.len();
        let check = |what, expected, found| {
            if found == expected { Ok(()) } else { Err(TowerError::Length { what, expected, found }) }
        };
        check("positions", n, starts.len())?;
        check("row counts", n, lens.len())?;
        let total: usize = lens.iter().sum();
        check("hidden rows", total, hidden.rows)?;
        check("hidden width", s.dim, hidden.cols)?;
        check("codes", total, codes.len())?;
        check("label mask", total, label_semantic.len())?;
        if let Some(u) = unseen {
            check("unseen rows", total, u.rows)?;
        }
        for (kv, (&start, &len)) in kvs.iter().zip(starts.iter().zip(lens)) {
            if start > kv.cache.len {
                return Err(TowerError::PositionGap { start, cached: kv.cache.len });
            }
            assert!(
                start + len <= kv.cache.capacity,
                "tower: {start} positions + {len} rows exceed the KV cache capacity {}",
                kv.cache.capacity
            );
        }
        let codes = stage_u32(self, codes);
        let mask = stage_u32(self, &flags(label_semantic));
        let labels = DeviceLabels { codes: codes.ptr(), mask: mask.ptr(), stride: 1 };
        let mut attend = |qkv: &GpuMatrix| self.attend_segments(s, w, qkv, kvs, starts, lens);
        let project = |x: &GpuMatrix, m: &[&GpuWeight]| m.iter().map(|w| linear_segments(self, x, lens, w)).collect();
        Ok(self.layer_with(s, w, hidden, labels, unseen, &project, &mut attend))
    }

    /// [`Cuda::attend`] of several requests' rows (`lens[i]` rows of request i at `starts[i]..` of
    /// `kvs[i]`'s cache): one prep over every row, then one prefill-attention launch for the
    /// requests above [`DECODE_ROWS`] rows and the split decode for each of the others.
    fn attend_segments(
        &self,
        s: &TowerShape,
        w: &TowerLayer<GpuWeight>,
        qkv: &GpuMatrix,
        kvs: &mut [&mut GpuTowerKv],
        starts: &[usize],
        lens: &[usize],
    ) -> GpuMatrix {
        let shape = attention_shape(s);
        let n = qkv.rows;
        let (mut keys, mut values, mut positions) = (Vec::new(), Vec::new(), Vec::new());
        for (kv, (&start, &len)) in kvs.iter().zip(starts.iter().zip(lens)) {
            keys.extend(std::iter::repeat_n(kv.cache.keys.ptr(), len));
            values.extend(std::iter::repeat_n(kv.cache.values.ptr(), len));
            positions.extend(start..start + len);
        }
        let seq = RowCaches::stage_addrs(self, &keys, &values, &positions);
        let (q, qg) = self.prep_with(s, w, qkv.ptr(), n, &kvs[0].cache, 0, seq.args());
        for (kv, (&start, &len)) in kvs.iter_mut().zip(starts.iter().zip(lens)) {
            kv.cache.len = start + len;
        }
        let gated = self.matrix(n, s.heads * s.head_dim);
        let firsts = attention::first_rows(lens);
        let (mut long_caches, mut long_firsts, mut long_lens, mut long_starts) = (vec![], vec![], vec![], vec![]);
        for (i, kv) in kvs.iter().enumerate() {
            let (first, len, start) = (firsts[i], lens[i], starts[i]);
            if len > DECODE_ROWS {
                long_caches.push(&kv.cache);
                long_firsts.push(first);
                long_lens.push(len);
                long_starts.push(start);
            } else if len > 0 {
                let hd = s.heads * s.head_dim;
                let at = |base: u64, bytes_per_row: usize| base + (first * bytes_per_row) as u64;
                let (q_at, qg_at, out_at) = (at(q.ptr(), hd * 4), at(qg.ptr(), 2 * hd * 2), at(gated.ptr(), hd * 2));
                let one = attention::ONE_SEQUENCE;
                attention::attend_decode_seq(self, &shape, q_at, qg_at, &kv.cache, len, start, out_at, one);
            }
        }
        let segments =
            PrefillSegments { caches: &long_caches, firsts: &long_firsts, lens: &long_lens, starts: &long_starts };
        attention::attend_prefill_segments(self, &shape, q.ptr(), qg.ptr(), &segments, gated.ptr());
        gated
    }

    /// One tower layer over `hidden`'s rows (`model.md` §6 steps 1–5), projecting with `project`
    /// (each weight over one input: `w1` and `w3` share theirs) and attending with `attend` (the
    /// wqkv rows in, the gated rows out).
    #[allow(clippy::too_many_arguments)]
    fn layer_with(
        &self,
        s: &TowerShape,
        w: &TowerLayer<GpuWeight>,
        hidden: &GpuMatrix,
        labels: DeviceLabels,
        unseen: Option<&GpuMatrix>,
        project: &dyn Fn(&GpuMatrix, &[&GpuWeight]) -> Vec<GpuMatrix>,
        attend: &mut dyn FnMut(&GpuMatrix) -> GpuMatrix,
    ) -> GpuMatrix {
        let one = |x: &GpuMatrix, m: &GpuWeight| project(x, &[m]).pop().expect("one output per weight");
        let (n, dim) = (hidden.rows, s.dim);
        assert_eq!(hidden.cols, dim, "tower hidden width");
        assert!(unseen.is_none_or(|u| u.rows == n && u.cols == dim), "tower unseen vector shape");

        // 1–2. eh_proj(concat(enorm(mask ? Emb[code] : 0 (+ U)), hnorm(h))).
        let eh = self.matrix(n, 2 * dim);
        let args = [
            hidden.ptr().into(),
            w.code_embedding.ptr.into(),
            labels.codes.into(),
            labels.mask.into(),
            labels.stride.into(),
            unseen.map_or(0, |u| u.ptr()).into(),
            w.enorm.ptr.into(),
            w.hnorm.ptr.into(),
            eh.ptr().into(),
            dim.into(),
            w.code_embedding.shape[0].into(),
            (s.norm_eps as f32).into(),
        ];
        self.kernels.tower.mix.launch(self.stream(), Dims::linear(n, THREADS), &args);
        let mut x = one(&eh, &w.eh_proj);

        // 3. Gated attention over this layer's cache, rows written at start.. (replacing any).
        let a = norm::rms_norm(self, &x, &w.attention_norm, s.norm_eps);
        let qkv = one(&a, &w.wqkv);
        assert_eq!(qkv.cols, s.qkv_rows(), "tower wqkv output width");
        let gated = attend(&qkv);
        let attn = one(&gated, &w.wo);

        // 4. SwiGLU block (x += attn fused with ffn_norm), 5. final_layernorm (fused with x += down).
        let f = norm::add_rms_norm(self, &mut x, &attn, &w.ffn_norm, s.norm_eps);
        let [w1, w3]: [GpuMatrix; 2] =
            project(&f, &[&w.w1, &w.w3]).try_into().unwrap_or_else(|_| unreachable!("one output per weight"));
        // Every projection path takes the staged decode kernel at ≤ 8 rows, so the SwiGLU can
        // fold into it (`linear::swiglu_project`: the same bits, one launch fewer).
        let down =
            linear::swiglu_project(self, &w1, &w3, &w.w2).unwrap_or_else(|| one(&moe::swiglu(self, &w1, &w3), &w.w2));
        norm::add_rms_norm(self, &mut x, &down, &w.final_norm, s.norm_eps)
    }

    /// [`TowerOps::tower_unseen`] of `rows` rows whose codes and flags are already on the device
    /// (no host data, no sync: capturable).
    pub fn tower_unseen_device(&self, table: &GpuWeight, s: &TowerShape, u: DeviceUnseen, rows: usize) -> GpuMatrix {
        assert_eq!(table.matrix_dims(), (u.codebooks * s.codebook_vocab, s.dim), "codebook embedding table shape");
        let out = self.matrix(rows, s.dim);
        let args = [
            table.ptr.into(),
            u.codes.into(),
            u.semantic.into(),
            out.ptr().into(),
            u.codebooks.into(),
            u.first.into(),
            s.codebook_vocab.into(),
            s.dim.into(),
        ];
        self.kernels.tower.unseen.launch(self.stream(), Dims::linear(rows, THREADS), &args);
        out
    }

    /// The tower's q/k norm, interleaved RoPE and cache write for `qkv`'s rows at `start..`, then
    /// causal attention over the cache. Returns the gated output (what `wo` reads).
    fn attend(
        &self,
        s: &TowerShape,
        w: &TowerLayer<GpuWeight>,
        qkv: &GpuMatrix,
        cache: &mut GpuKvCache,
        start: usize,
    ) -> GpuMatrix {
        let shape = attention_shape(s);
        let n = qkv.rows;
        let (q, qg) = self.prep(s, w, qkv.ptr(), n, cache, start);
        if n <= DECODE_ROWS {
            attention::attend_decode(self, &shape, &q, &qg, cache, n, start)
        } else {
            attention::attend_prefill(self, &shape, &q, &qg, cache, n, start)
        }
    }

    /// [`Cuda::attend`] of one decode row per request: row r of `qkv` at position `starts[r]` of
    /// `kvs[r]`'s cache (one prep and one split decode, ending in its merge, over all rows).
    fn attend_rows(
        &self,
        s: &TowerShape,
        w: &TowerLayer<GpuWeight>,
        qkv: &GpuMatrix,
        kvs: &mut [&mut GpuTowerKv],
        starts: &[usize],
    ) -> GpuMatrix {
        let n = kvs.len();
        let mut caches: Vec<&mut GpuKvCache> = kvs.iter_mut().map(|kv| &mut kv.cache).collect();
        for cache in &caches {
            assert_eq!(cache.splits, caches[0].splits, "tower decode rows: caches of different capacities");
        }
        let seq = RowCaches::stage(self, &caches, starts);
        let (q, qg) = self.prep_with(s, w, qkv.ptr(), n, caches[0], 0, seq.args());
        let gated = self.matrix(n, s.heads * s.head_dim);
        let shape = attention_shape(s);
        attention::attend_decode_seq(self, &shape, q.ptr(), qg.ptr(), caches[0], n, 0, gated.ptr(), seq.args());
        for (cache, &start) in caches.iter_mut().zip(starts) {
            cache.len = start + 1;
        }
        gated
    }

    /// The q/k norm, interleaved RoPE and cache write of `n` wqkv rows at `qkv` for positions
    /// `start..`: returns q (f32, scaled for exp2 scores) and q|gate (bf16, the gates read later).
    fn prep(
        &self,
        s: &TowerShape,
        w: &TowerLayer<GpuWeight>,
        qkv: u64,
        n: usize,
        cache: &mut GpuKvCache,
        start: usize,
    ) -> (PoolBuf, GpuMatrix) {
        let out = self.prep_with(s, w, qkv, n, cache, start, attention::ONE_SEQUENCE);
        cache.len = start + n;
        out
    }

    /// [`Cuda::prep`]'s kernel, for one sequence or (`seq` from `RowCaches`) one row per request;
    /// the caller advances the caches' lengths.
    #[allow(clippy::too_many_arguments)]
    fn prep_with(
        &self,
        s: &TowerShape,
        w: &TowerLayer<GpuWeight>,
        qkv: u64,
        n: usize,
        cache: &GpuKvCache,
        start: usize,
        seq: [Arg; 3],
    ) -> (PoolBuf, GpuMatrix) {
        let (h, hkv, hd) = (s.heads, s.kv_heads, s.head_dim);
        let q = self.scratch(n * h * hd * 4);
        let qg = self.matrix(n, 2 * h * hd);
        let q_scale = (std::f64::consts::LOG2_E / (hd as f64).sqrt()) as f32;
        let (counter, first) = cache.position_args(start);
        let args = [
            qkv.into(),
            w.q_norm.ptr.into(),
            w.k_norm.ptr.into(),
            cache.inv_freq.ptr().into(),
            q.ptr().into(),
            qg.ptr().into(),
            cache.keys.ptr().into(),
            cache.values.ptr().into(),
            h.into(),
            hkv.into(),
            s.rotary_dim.into(),
            first.into(),
            counter.into(),
            (s.norm_eps as f32).into(),
            q_scale.into(),
            seq[0],
            seq[1],
            seq[2],
        ];
        self.kernels.tower.prep.launch(self.stream(), Dims::grid(((h + hkv) as u32, n as u32, 1), hd as u32), &args);
        (q, qg)
    }
}
