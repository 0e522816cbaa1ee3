//! The RVQ lookup and the post_module transformer on the GPU (`codec.md` §1.2–1.3): codebook
//! gather + out_proj sum, RMSNorm, fused q|k|v projection, interleaved RoPE, attention over the
//! window of the last `window − 1` frames plus the new ones, LayerScale, SwiGLU.

use super::super::Cuda;
use super::super::launch::Dims;
use super::super::tensor::{Elem, GpuMatrix, GpuWeight};
use super::GpuKvWindow;
use super::gemm::{Epilogue, Gemm, Residual, Taps, check_f16, gemm};
use crate::backend::codec::{CodecAttentionShape, RvqCodebook};
use crate::model::weights::TransformerLayer;

const THREADS: u32 = 256;
/// The attention kernel's head width (`ATTN_HEAD_DIM`) and warps per block (`ATTN_WARPS`).
const HEAD_DIM: usize = 64;
const ATTN_WARPS: usize = 4;

/// `q₀ + (((q₁ + q₂) + …) + q₉)` per frame, `q_i = out_proj_i(codebook_i[code_i])`.
pub fn rvq(cuda: &Cuda, books: &[RvqCodebook<GpuWeight>], codes: &[u32]) -> GpuMatrix {
    assert!(!books.is_empty() && codes.len().is_multiple_of(books.len()), "codes are whole frames");
    let (latent, dim) = (books[0].proj.shape[0], books[0].codebook.shape[1]);
    for (i, b) in books.iter().enumerate() {
        let size = b.codebook.shape[0];
        check_f16(&b.codebook, size * dim, "codebook");
        check_f16(&b.proj, latent * dim, "out_proj weight");
        check_f16(&b.bias, latent, "out_proj bias");
        let column = codes.iter().skip(i).step_by(books.len());
        assert!(column.clone().all(|&c| (c as usize) < size), "codebook {i}: a code is not below {size}");
    }
    let frames = codes.len() / books.len();
    let z = cuda.matrix_f16(frames, latent);
    if frames == 0 {
        return z;
    }
    let table: Vec<u64> = books.iter().flat_map(|b| [b.codebook.ptr, b.proj.ptr, b.bias.ptr]).collect();
    let (staged_codes, staged_table) = (cuda.scratch(codes.len() * 4), cuda.scratch(table.len() * 8));
    cuda.stage_to_device(staged_codes.ptr(), codes);
    cuda.stage_to_device(staged_table.ptr(), &table);
    let args = [
        staged_codes.ptr().into(),
        staged_table.ptr().into(),
        z.ptr().into(),
        frames.into(),
        books.len().into(),
        latent.into(),
        dim.into(),
    ];
    let n = frames * latent;
    cuda.kernels.codec.rvq.launch(cuda.stream(), Dims::linear(n.div_ceil(THREADS as usize), THREADS), &args);
    z
}

/// `f16(x · rsqrt(mean(x²) + eps)) · w` per row.
pub fn rms_norm(cuda: &Cuda, w: &GpuWeight, eps: f32, x: &GpuMatrix) -> GpuMatrix {
    assert_eq!(x.elem, Elem::F16, "codec activations are f16");
    check_f16(w, x.cols, "RMSNorm weight");
    let y = cuda.matrix_f16(x.rows, x.cols);
    if x.rows > 0 {
        let args = [x.ptr().into(), w.ptr.into(), y.ptr().into(), x.cols.into(), eps.into()];
        cuda.kernels.codec.rms_norm.launch(cuda.stream(), Dims::linear(x.rows, THREADS), &args);
    }
    y
}

/// One pre-norm layer with LayerScale over new frames: `x` stacks each stream's frames
/// (`rows[s]` of them, with RoPE rows `ropes[s]`), and each stream continues its own window
/// `kvs[s]`. Norms and projections run once over all rows; RoPE, attention and the window are
/// each stream's own.
pub fn layer(
    cuda: &Cuda,
    s: &CodecAttentionShape,
    w: &TransformerLayer<GpuWeight>,
    ropes: &[&[f32]],
    x: &GpuMatrix,
    rows: &[usize],
    kvs: &mut [&mut GpuKvWindow],
) -> GpuMatrix {
    let width = s.heads * s.head_dim;
    assert_eq!(s.head_dim, HEAD_DIM, "the codec attention kernel is built for head_dim 64");
    assert_eq!((ropes.len(), kvs.len()), (rows.len(), rows.len()), "one rope and one window per stream");
    assert_eq!((x.cols, rows.iter().sum::<usize>()), (width, x.rows), "transformer input");
    if x.rows == 0 {
        return cuda.matrix_f16(0, width);
    }
    let normed = rms_norm(cuda, &w.attention_norm, s.norm_eps, x);
    let qkv = linear(cuda, &normed, &w.wqkv, 3 * width, Epilogue::None, None);
    let attended = cuda.matrix_f16(x.rows, width);
    let mut at = 0;
    for ((&n, rope), kv) in rows.iter().zip(ropes).zip(kvs.iter_mut()).filter(|((n, _), _)| **n > 0) {
        attend_stream(cuda, s, qkv.row_ptr(at), n, rope, kv, attended.row_ptr(at));
        at += n;
    }
    let gamma = Some(&w.attention_layer_scale);
    let h = linear(cuda, &attended, &w.wo, width, Epilogue::None, Some(Residual { x, gamma }));
    let normed = rms_norm(cuda, &w.ffn_norm, s.norm_eps, &h);
    let inter = w.w1.shape[0];
    let up = linear(cuda, &normed, &w.w3, inter, Epilogue::None, None);
    let gated = linear(cuda, &normed, &w.w1, inter, Epilogue::SiluGate(&up), None);
    let gamma = Some(&w.ffn_layer_scale);
    linear(cuda, &gated, &w.w2, width, Epilogue::None, Some(Residual { x: &h, gamma }))
}

/// One stream's attention over its `n` new frames: RoPE and split of its `qkv` rows (at `qkv`)
/// into queries and the window's keys and values, attention into its rows at `out`, and its
/// window carried forward.
fn attend_stream(
    cuda: &Cuda,
    s: &CodecAttentionShape,
    qkv: u64,
    n: usize,
    rope: &[f32],
    kv: &mut GpuKvWindow,
    out: u64,
) {
    let width = s.heads * s.head_dim;
    assert_eq!((kv.keys.cols, kv.keys.rows), (width, s.window - 1), "attention window shape");
    assert_eq!(rope.len(), n * s.head_dim, "one rope row per frame");
    // The window's past rows, then the new frames' keys and values (capacity independent of
    // the window's fill, so the pool's size classes settle after the first call).
    let (keys, values) = (cuda.matrix_f16(s.window - 1 + n, width), cuda.matrix_f16(s.window - 1 + n, width));
    let past = kv.len;
    if past > 0 {
        let bytes = past * width * 2;
        cuda.copy_device_to_device(keys.ptr(), kv.keys.ptr(), bytes);
        cuda.copy_device_to_device(values.ptr(), kv.values.ptr(), bytes);
    }
    let q = cuda.matrix_f16(n, width);
    let staged_rope = cuda.scratch(rope.len() * 4);
    cuda.stage_to_device(staged_rope.ptr(), rope);
    let args = [
        qkv.into(),
        staged_rope.ptr().into(),
        q.ptr().into(),
        keys.ptr().into(),
        values.ptr().into(),
        n.into(),
        width.into(),
        s.head_dim.into(),
        past.into(),
    ];
    let threads = n * 3 * width / 2;
    cuda.kernels.codec.rope_split.launch(
        cuda.stream(),
        Dims::linear(threads.div_ceil(THREADS as usize), THREADS),
        &args,
    );
    attention(cuda, s, &q, &keys, &values, past, out);

    // Keep the last `window − 1` rows for the next call.
    kv.len = (past + n).min(s.window - 1);
    let from = (past + n - kv.len) * width * 2;
    cuda.copy_device_to_device(kv.keys.ptr(), keys.ptr() + from as u64, kv.len * width * 2);
    cuda.copy_device_to_device(kv.values.ptr(), values.ptr() + from as u64, kv.len * width * 2);
}

/// `input · Wᵀ` (no bias), with an epilogue and an optional residual.
fn linear(
    cuda: &Cuda,
    input: &GpuMatrix,
    weight: &GpuWeight,
    out: usize,
    epilogue: Epilogue<'_>,
    residual: Option<Residual<'_>>,
) -> GpuMatrix {
    gemm(cuda, &Gemm { input, rows: input.rows, taps: Taps::Linear, weight, n: out, bias: None, epilogue, residual })
}

/// Attention of the `q` rows into `q.rows` rows at `out`; query `r` is row `past + r` of
/// `keys` / `values`.
fn attention(
    cuda: &Cuda,
    s: &CodecAttentionShape,
    q: &GpuMatrix,
    keys: &GpuMatrix,
    values: &GpuMatrix,
    past: usize,
    out: u64,
) {
    let tasks = q.rows * s.heads;
    if tasks == 0 {
        return;
    }
    let shared = ATTN_WARPS * (HEAD_DIM + s.window) * 4;
    assert!(shared <= 48 << 10, "attention window {} needs more shared memory than a default launch", s.window);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let args = [
        q.ptr().into(),
        keys.ptr().into(),
        values.ptr().into(),
        out.into(),
        q.rows.into(),
        s.heads.into(),
        past.into(),
        s.window.into(),
        scale.into(),
    ];
    let dims = Dims::linear(tasks.div_ceil(ATTN_WARPS), (ATTN_WARPS * 32) as u32).with_shared(shared as u32);
    cuda.kernels.codec.attention.launch(cuda.stream(), dims, &args);
}
