//! Element types that appear in checkpoint files, with their on-disk spellings.

use std::fmt;

/// An element type as stored in a safetensors shard or a `torch.save` storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    Bool,
    U8,
    I8,
    I16,
    I32,
    I64,
    F8E4M3,
    F8E5M2,
    F16,
    BF16,
    F32,
    F64,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 | Dtype::F8E4M3 | Dtype::F8E5M2 => 1,
            Dtype::I16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::F64 => 8,
        }
    }

    /// Whether values of this type are floating point (what model tensors must be).
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F8E4M3 | Dtype::F8E5M2 | Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
    }

    /// The spelling used in a safetensors header (`"BF16"`, `"F8_E4M3"`, …).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::I16 => "I16",
            Dtype::I32 => "I32",
            Dtype::I64 => "I64",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
        }
    }

    /// Parses a safetensors header dtype; `None` for types we do not read (e.g. `F4`, `U64`).
    pub fn from_safetensors_name(name: &str) -> Option<Dtype> {
        Some(match name {
            "BOOL" => Dtype::Bool,
            "U8" => Dtype::U8,
            "I8" => Dtype::I8,
            "I16" => Dtype::I16,
            "I32" => Dtype::I32,
            "I64" => Dtype::I64,
            "F8_E4M3" => Dtype::F8E4M3,
            "F8_E5M2" => Dtype::F8E5M2,
            "F16" => Dtype::F16,
            "BF16" => Dtype::BF16,
            "F32" => Dtype::F32,
            "F64" => Dtype::F64,
            _ => return None,
        })
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.safetensors_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let all = [
            Dtype::Bool,
            Dtype::U8,
            Dtype::I8,
            Dtype::I16,
            Dtype::I32,
            Dtype::I64,
            Dtype::F8E4M3,
            Dtype::F8E5M2,
            Dtype::F16,
            Dtype::BF16,
            Dtype::F32,
            Dtype::F64,
        ];
        for d in all {
            assert_eq!(Dtype::from_safetensors_name(d.safetensors_name()), Some(d));
        }
        assert_eq!(Dtype::from_safetensors_name("F4"), None);
    }
}
