//! What the CUDA backend computes with: weights resident in the arena in their stored format,
//! and activation matrices in pool buffers (bf16, or f16 for the codec).

use std::sync::Arc;

use half::{bf16, f16};

use super::memory::{DeviceBuffer, MemoryError, Pool, PoolBuf};
use crate::backend::cpu::Matrix;

/// Element type of a resident weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    /// Large matrices, exactly as published.
    Bf16,
    /// Norm gains, gates, conv taps, block scales: widened exactly from bf16/f16/f32 at upload.
    F32,
    /// Routed-expert weights (e4m3 codes; their `weight_scale_inv` grid is a separate F32 weight).
    Fp8E4m3,
    /// Codec weights: folded in f32 on the host, then rounded to nearest even (`codec_weight`).
    F16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::Bf16 | DType::F16 => 2,
            DType::F32 => 4,
            DType::Fp8E4m3 => 1,
        }
    }
}

/// A weight resident on the GPU.
pub struct GpuWeight {
    pub ptr: u64,
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// The arena chunk holding it.
    pub(crate) _chunk: Arc<DeviceBuffer>,
}

impl GpuWeight {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// `[rows, cols]` of a matrix (trailing dims folded into cols).
    pub fn matrix_dims(&self) -> (usize, usize) {
        (self.shape[0], self.shape[1..].iter().product())
    }
}

/// Element type of an activation matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// The backbone's and tower's activations.
    Bf16,
    /// The codec decoder's activations (the reference decodes in FP16).
    F16,
    /// The codec encoder's activations (the reference encodes in f32).
    F32,
}

impl Elem {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Elem::Bf16 | Elem::F16 => 2,
            Elem::F32 => 4,
        }
    }
}

/// A row-major `[rows, cols]` activation matrix.
pub struct GpuMatrix {
    pub(crate) buf: PoolBuf,
    pub rows: usize,
    pub cols: usize,
    pub elem: Elem,
}

impl GpuMatrix {
    /// An uninitialised bf16 matrix from the pool.
    pub fn uninit(pool: &Arc<Pool>, rows: usize, cols: usize) -> Result<GpuMatrix, MemoryError> {
        GpuMatrix::uninit_of(pool, rows, cols, Elem::Bf16)
    }

    /// An uninitialised matrix of `elem` from the pool.
    pub fn uninit_of(pool: &Arc<Pool>, rows: usize, cols: usize, elem: Elem) -> Result<GpuMatrix, MemoryError> {
        Ok(GpuMatrix { buf: pool.take(rows * cols * elem.size())?, rows, cols, elem })
    }

    pub fn ptr(&self) -> u64 {
        self.buf.ptr()
    }

    /// Address of row `r`.
    pub fn row_ptr(&self, r: usize) -> u64 {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        self.ptr() + (r * self.cols * self.elem.size()) as u64
    }

    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// Bytes of the matrix's elements.
    pub fn bytes(&self) -> usize {
        self.len() * self.elem.size()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn pool(&self) -> &Arc<Pool> {
        self.buf.pool()
    }
}

impl Clone for GpuMatrix {
    fn clone(&self) -> GpuMatrix {
        let pool = self.pool();
        let copy = GpuMatrix::uninit_of(pool, self.rows, self.cols, self.elem)
            .expect("GPU memory budget exhausted cloning an activation");
        // SAFETY: both buffers are live pool buffers of at least rows·cols·elem.size() bytes; the
        // copy is ordered on the one stream after the writes of `self`.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(copy.ptr(), self.ptr(), self.bytes(), pool.stream().cu_stream())
        }
        .expect("device-to-device copy");
        copy
    }
}

/// f32 → bf16 with round-to-nearest-even (as torch's `.to(torch.bfloat16)`).
pub fn to_bf16_vec(data: &[f32]) -> Vec<bf16> {
    data.iter().map(|&v| bf16::from_f32(v)).collect()
}

/// A host matrix rounded to bf16 (what a GPU activation holds), back in f32.
pub fn round_to_bf16(m: &Matrix) -> Matrix {
    Matrix::from_vec(m.rows, m.cols, m.data.iter().map(|&v| bf16::from_f32(v).to_f32()).collect())
}

/// f32 → f16 with round-to-nearest-even (as torch's `.to(torch.float16)`).
pub fn to_f16_vec(data: &[f32]) -> Vec<f16> {
    data.iter().map(|&v| f16::from_f32(v)).collect()
}

/// f32 values rounded to f16 (what an f16 weight or activation holds), back in f32.
pub fn round_to_f16_vec(data: &[f32]) -> Vec<f32> {
    data.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
}

/// A host matrix rounded to f16, back in f32.
pub fn round_to_f16(m: &Matrix) -> Matrix {
    Matrix::from_vec(m.rows, m.cols, round_to_f16_vec(&m.data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounding_is_nearest_even_and_saturates_to_infinity() {
        // 1 + 2⁻¹¹ is halfway between 1 and the next f16 (1 + 2⁻¹⁰): ties go to the even 1.
        assert_eq!(round_to_f16_vec(&[1.0 + 2f32.powi(-11)]), vec![1.0]);
        assert_eq!(round_to_f16_vec(&[1.0 + 3.0 * 2f32.powi(-11)]), vec![1.0 + 2.0 * 2f32.powi(-10)]);
        assert_eq!(round_to_f16_vec(&[65504.0, 70000.0]), vec![65504.0, f32::INFINITY]);
        assert_eq!(to_f16_vec(&[0.5, -2.0]).iter().map(|v| v.to_bits()).collect::<Vec<_>>(), vec![0x3800, 0xC000]);
    }
}
