//! The CPU reference backend: plain f32 loops (f64 where the reference's fp32 accumulation
//! matters), written to be obviously correct rather than fast. It is the oracle every CUDA kernel
//! is checked against and what CI and the demo run.

pub mod backbone;
pub mod codec;
mod saved;
mod scalar;
mod tower;

use super::BackendTypes;
use crate::checkpoint::TensorView;
use crate::model::weights::TensorSpec;

pub use saved::{CpuSaved, CpuSavedPart};
pub use tower::CpuTowerKv;

/// The CPU backend. Stateless: per-request state lives in the state types of each part.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

/// A row-major `[rows, cols]` f32 matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl Matrix {
    pub fn zeros(rows: usize, cols: usize) -> Matrix {
        Matrix { rows, cols, data: vec![0.0; rows * cols] }
    }

    pub fn from_vec(rows: usize, cols: usize, data: Vec<f32>) -> Matrix {
        assert_eq!(data.len(), rows * cols, "matrix data length");
        Matrix { rows, cols, data }
    }

    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    pub fn row_mut(&mut self, r: usize) -> &mut [f32] {
        &mut self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// A weight as the CPU computes with it: every stored format converted exactly to f32.
/// FP8 weights keep their decoded code values; the block scale is applied by the op that uses
/// them, exactly as `fp8 × scale_inv`.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuWeight {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl CpuWeight {
    /// Row `r` of a 2-D weight.
    pub fn row(&self, r: usize) -> &[f32] {
        let cols = self.shape[1..].iter().product::<usize>();
        &self.data[r * cols..(r + 1) * cols]
    }
}

impl BackendTypes for Cpu {
    type Act = Matrix;
    type Weight = CpuWeight;

    fn upload(&self, spec: &TensorSpec, view: TensorView<'_>) -> CpuWeight {
        let data = view.to_f32_vec().unwrap_or_else(|| panic!("tensor `{}` is not a float tensor", spec.name));
        CpuWeight { shape: view.shape.to_vec(), data }
    }

    fn upload_f32(&self, shape: &[usize], data: Vec<f32>) -> CpuWeight {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "upload_f32 shape");
        CpuWeight { shape: shape.to_vec(), data }
    }

    fn to_host(&self, a: &Matrix) -> Matrix {
        a.clone()
    }

    fn act_rows(&self, a: &Matrix, start: usize, count: usize) -> Matrix {
        Matrix::from_vec(count, a.cols, a.data[start * a.cols..(start + count) * a.cols].to_vec())
    }

    fn stack_rows(&self, parts: &[Matrix]) -> Matrix {
        let cols = parts.first().map_or(0, |p| p.cols);
        assert!(parts.iter().all(|p| p.cols == cols), "stack_rows: parts of different widths");
        let data: Vec<f32> = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
        Matrix::from_vec(data.len().checked_div(cols).unwrap_or(0), cols, data)
    }
}
