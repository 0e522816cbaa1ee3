//! Writes one safetensors file, streaming tensor data after a header that is space-padded to a
//! multiple of 8 bytes as the reference writer pads it. Used by the checkpoint writer and by
//! `trace` dumps.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use serde_json::{Value, json};

use super::Dtype;

/// What the header says about one tensor.
#[derive(Clone, Copy, Debug)]
pub struct TensorHeader<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [usize],
}

impl TensorHeader<'_> {
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// Writes `tensors` in order; `data(i)` returns tensor `i`'s little-endian bytes when it is due,
/// so only one tensor is in memory at a time.
pub fn write_safetensors(
    path: &Path,
    tensors: &[TensorHeader<'_>],
    mut data: impl FnMut(usize) -> Vec<u8>,
) -> io::Result<()> {
    let header = header_bytes(tensors);
    let mut w = BufWriter::with_capacity(8 << 20, File::create(path)?);
    w.write_all(&(header.len() as u64).to_le_bytes())?;
    w.write_all(&header)?;
    for (i, t) in tensors.iter().enumerate() {
        let bytes = data(i);
        if bytes.len() != t.bytes() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("tensor `{}`: {} bytes for shape {:?} of {}", t.name, bytes.len(), t.shape, t.dtype),
            ));
        }
        w.write_all(&bytes)?;
    }
    w.into_inner().map_err(|e| e.into_error())?.sync_all()
}

fn header_bytes(tensors: &[TensorHeader<'_>]) -> Vec<u8> {
    let mut entries = serde_json::Map::new();
    entries.insert("__metadata__".into(), json!({ "format": "pt" }));
    let mut offset = 0usize;
    for t in tensors {
        let end = offset + t.bytes();
        entries.insert(
            t.name.to_owned(),
            json!({ "dtype": t.dtype.safetensors_name(), "shape": t.shape, "data_offsets": [offset, end] }),
        );
        offset = end;
    }
    let mut header = serde_json::to_vec(&Value::Object(entries)).expect("header serialises");
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    header
}

/// f32 values as little-endian bytes.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::safetensors::SafetensorsFile;

    #[test]
    fn written_file_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let tensors = [
            TensorHeader { name: "a", dtype: Dtype::F32, shape: &[2, 2] },
            TensorHeader { name: "b", dtype: Dtype::U8, shape: &[3] },
        ];
        write_safetensors(&path, &tensors, |i| if i == 0 { f32_bytes(&[1.0, 2.0, 3.0, 4.0]) } else { vec![7, 8, 9] })
            .unwrap();
        let f = SafetensorsFile::open(&path).unwrap();
        assert_eq!(f.view("a").unwrap().to_f32_vec().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(f.view("b").unwrap().bytes, &[7, 8, 9]);
    }
}
