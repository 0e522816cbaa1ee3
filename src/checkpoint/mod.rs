//! Bytes on disk → named, typed, bounds-checked host tensor views. Nothing here executes
//! anything read from a file, and every error names the file and, where there is one, the tensor.

pub mod dtype;
pub mod finite;
pub mod fp8;
pub mod pickle;
pub mod pth;
pub mod safetensors;
pub mod safetensors_writer;
pub mod sequential;
pub mod tokenizer;

pub use dtype::Dtype;

/// A borrowed, contiguous, row-major tensor inside a mapped file.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl TensorView<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Converts any float dtype to f32 (exactly: every supported format fits in f32).
    /// Returns `None` for integer or boolean tensors.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        let b = self.bytes;
        Some(match self.dtype {
            Dtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Dtype::BF16 => {
                b.chunks_exact(2).map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect()
            }
            Dtype::F16 => {
                b.chunks_exact(2).map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect()
            }
            Dtype::F64 => {
                b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8-byte chunk")) as f32).collect()
            }
            Dtype::F8E4M3 => b.iter().map(|&x| fp8::e4m3_to_f32(x)).collect(),
            Dtype::F8E5M2 => b.iter().map(|&x| fp8::e5m2_to_f32(x)).collect(),
            _ => return None,
        })
    }
}

/// Formats a shape the way PyTorch prints it: `[4096, 2048]`.
pub fn shape_str(shape: &[usize]) -> String {
    format!("{shape:?}")
}
