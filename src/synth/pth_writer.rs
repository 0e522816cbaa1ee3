//! Writes a state dict as a `torch.save` archive, byte-for-byte in torch 2.x's layout (`codec.md` §4).
//!
//! torch puts `data.pkl` first, but the pickle names every tensor, so it can only be written once all
//! tensors have been seen. To keep torch's exact record order without holding the tensors, their bytes
//! are spooled to a temporary file beside the output as they arrive and copied in afterwards.

pub mod zip_writer;

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufWriter, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::checkpoint::Dtype;
use crate::checkpoint::pickle::storage_class_name;
use zip_writer::ZipWriter;

/// One tensor to write: contiguous row-major little-endian bytes.
#[derive(Clone, Debug)]
pub struct PthTensorOut {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// Writes `tensors` (in order) as an `OrderedDict` state dict that `torch.load(weights_only=True)`
/// reads. The archive folder is the file name without its extension, as torch names it.
pub fn write_state_dict(path: &Path, tensors: impl Iterator<Item = PthTensorOut>) -> io::Result<()> {
    write_state_dict_with_id(path, tensors, &random_serialization_id())
}

/// [`write_state_dict`] with a chosen `.data/serialization_id` (torch draws 40 random digits), for
/// reproducible output.
pub fn write_state_dict_with_id(
    path: &Path,
    tensors: impl Iterator<Item = PthTensorOut>,
    serialization_id: &str,
) -> io::Result<()> {
    let prefix = archive_name(path)?;
    let spool = Spool::create(path)?;
    let mut sink = BufWriter::new(&spool.file);
    let mut metas = Vec::new();
    for PthTensorOut { name, dtype, shape, data } in tensors {
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if numel.and_then(|n| n.checked_mul(dtype.size())) != Some(data.len()) {
            return Err(invalid(format!(
                "tensor {name}: {} bytes do not match shape {shape:?} of {dtype}",
                data.len()
            )));
        }
        if matches!(dtype, Dtype::F8E4M3 | Dtype::F8E5M2) {
            return Err(invalid(format!("tensor {name}: {dtype} has no torch storage class")));
        }
        sink.write_all(&data)?;
        let (crc, size, numel) = (crc32fast::hash(&data), data.len() as u64, numel.unwrap_or(0));
        metas.push(Meta { name, dtype, shape, numel, size, crc });
    }
    sink.flush()?;
    drop(sink);

    let mut zip = ZipWriter::new(BufWriter::with_capacity(1 << 20, File::create(path)?));
    zip.add(&format!("{prefix}/data.pkl"), &pickle_state_dict(&metas))?;
    zip.add(&format!("{prefix}/.format_version"), b"1")?;
    zip.add(&format!("{prefix}/.storage_alignment"), b"64")?;
    zip.add(&format!("{prefix}/byteorder"), b"little")?;
    let mut spooled = &spool.file;
    spooled.rewind()?;
    for (i, m) in metas.iter().enumerate() {
        zip.add_from_reader(&format!("{prefix}/data/{i}"), m.size, m.crc, &mut spooled)?;
    }
    zip.add(&format!("{prefix}/version"), b"3\n")?;
    zip.add(&format!("{prefix}/.data/serialization_id"), serialization_id.as_bytes())?;
    zip.finish()?;
    Ok(())
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// torch's archive folder name: the file name up to its last dot (`codec.pth` → `codec`).
fn archive_name(path: &Path) -> io::Result<String> {
    let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| invalid(format!("bad file name {path:?}")))?;
    let stem = name.rsplit_once('.').map_or(name, |(stem, _)| stem);
    if stem.is_empty() {
        // torch refuses these too ("invalid file name").
        return Err(invalid(format!("file name {name:?} has an empty stem")));
    }
    Ok(stem.to_owned())
}

/// 40 random decimal digits, like torch's `.data/serialization_id`.
fn random_serialization_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let state = std::collections::hash_map::RandomState::new();
    (0..5u64)
        .map(|i| {
            let mut h = state.build_hasher();
            h.write_u128(seed);
            h.write_u64(i);
            format!("{:08}", h.finish() % 100_000_000)
        })
        .collect()
}

/// A scratch file beside the output, removed when dropped (also on error).
struct Spool {
    path: PathBuf,
    file: File,
}

impl Spool {
    fn create(target: &Path) -> io::Result<Spool> {
        // Unique per process and call, so concurrent writers never share a spool.
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = target.file_name().unwrap_or_default().to_string_lossy();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = target.with_file_name(format!(".{name}.{}-{n}.spool", std::process::id()));
        let file = File::options().read(true).write(true).create(true).truncate(true).open(&path)?;
        Ok(Spool { path, file })
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// What stays in memory per tensor once its bytes are spooled.
struct Meta {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    numel: usize,
    size: u64,
    crc: u32,
}

/// Emits exactly what CPython's protocol-2 pickler writes for torch.save of an `OrderedDict` of
/// contiguous tensors: same opcodes, same memo numbering, same batching.
fn pickle_state_dict(metas: &[Meta]) -> Vec<u8> {
    let mut p = Pickler::default();
    p.out.extend_from_slice(&[0x80, 2]);
    p.shared_global("collections", "OrderedDict");
    p.out.extend_from_slice(b")R");
    p.put();
    // CPython's batch_setitems: MARK … SETITEMS per 1000 items, a lone trailing item uses SETITEM.
    for (b, batch) in metas.chunks(1000).enumerate() {
        if batch.len() > 1 {
            p.out.push(b'(');
        }
        for (i, m) in batch.iter().enumerate() {
            p.unicode(&m.name);
            p.put();
            p.tensor(m, b * 1000 + i);
        }
        p.out.push(if batch.len() > 1 { b'u' } else { b's' });
    }
    p.out.push(b'.');
    p.out
}

#[derive(Default)]
struct Pickler {
    out: Vec<u8>,
    next: u32,
    /// Memo slots of objects torch pickles once and then refers to (globals, `'storage'`, `'cpu'`).
    shared: HashMap<String, u32>,
}

impl Pickler {
    fn put(&mut self) {
        let i = self.next;
        self.next += 1;
        match u8::try_from(i) {
            Ok(b) => self.out.extend_from_slice(&[b'q', b]),
            Err(_) => {
                self.out.push(b'r');
                self.out.extend_from_slice(&i.to_le_bytes());
            }
        }
    }

    /// Emits `fresh` and memoises it the first time `id` is seen, a memo get afterwards.
    fn shared(&mut self, id: &str, fresh: impl FnOnce(&mut Self)) {
        if let Some(&i) = self.shared.get(id) {
            match u8::try_from(i) {
                Ok(b) => self.out.extend_from_slice(&[b'h', b]),
                Err(_) => {
                    self.out.push(b'j');
                    self.out.extend_from_slice(&i.to_le_bytes());
                }
            }
        } else {
            fresh(self);
            self.shared.insert(id.to_owned(), self.next);
            self.put();
        }
    }

    fn shared_global(&mut self, module: &str, name: &str) {
        self.shared(&format!("global {module} {name}"), |p| {
            p.out.extend_from_slice(format!("c{module}\n{name}\n").as_bytes())
        });
    }

    fn unicode(&mut self, s: &str) {
        self.out.push(b'X');
        self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
    }

    fn int(&mut self, v: u64) {
        if v <= 0xff {
            self.out.extend_from_slice(&[b'K', v as u8]);
        } else if v <= 0xffff {
            self.out.push(b'M');
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else if v <= 0x7fff_ffff {
            self.out.push(b'J');
            self.out.extend_from_slice(&(v as u32).to_le_bytes());
        } else {
            // LONG1: minimal little-endian two's complement, as CPython sizes it (bits / 8 + 1 bytes).
            let n = (64 - v.leading_zeros() as usize) / 8 + 1;
            self.out.extend_from_slice(&[0x8a, n as u8]);
            self.out.extend_from_slice(&v.to_le_bytes()[..n.min(8)]);
            self.out.resize(self.out.len() + n.saturating_sub(8), 0);
        }
    }

    /// A tuple of ints the way CPython saves it: `()` bare, 1–3 items via TUPLEn, longer via MARK.
    fn int_tuple(&mut self, xs: &[usize]) {
        if xs.is_empty() {
            self.out.push(b')');
            return;
        }
        if xs.len() > 3 {
            self.out.push(b'(');
        }
        xs.iter().for_each(|&x| self.int(x as u64));
        self.out.push(match xs.len() {
            1 => 0x85,
            2 => 0x86,
            3 => 0x87,
            _ => b't',
        });
        self.put();
    }

    /// `_rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict())`, storage key `key`.
    fn tensor(&mut self, m: &Meta, key: usize) {
        self.shared_global("torch._utils", "_rebuild_tensor_v2");
        self.out.extend_from_slice(b"((");
        self.shared("'storage'", |p| p.unicode("storage"));
        self.shared_global("torch", storage_class_name(m.dtype));
        self.unicode(&key.to_string());
        self.put();
        self.shared("'cpu'", |p| p.unicode("cpu"));
        self.int(m.numel as u64);
        self.out.push(b't');
        self.put();
        self.out.push(b'Q');
        self.int(0);
        self.int_tuple(&m.shape);
        self.int_tuple(&contiguous_strides(&m.shape));
        self.out.push(0x89);
        self.shared_global("collections", "OrderedDict");
        self.out.extend_from_slice(b")R");
        self.put();
        self.out.push(b't');
        self.put();
        self.out.push(b'R');
        self.put();
    }
}

/// Row-major strides as torch computes them (a zero-size dim counts as 1).
fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1].max(1);
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_encode_like_cpython() {
        // Expected bytes: `pickle.dumps(v, 2)[2:-1].hex()` from CPython 3.11.
        let cases: [(u64, &str); 9] = [
            (255, "4bff"),
            (256, "4d0001"),
            (65535, "4dffff"),
            (65536, "4a00000100"),
            (0x7fff_ffff, "4affffff7f"),
            (1 << 31, "8a050000008000"),
            (1 << 40, "8a06000000000001"),
            (1 << 63, "8a09000000000000008000"),
            (u64::MAX, "8a09ffffffffffffffff00"),
        ];
        for (v, want) in cases {
            let mut p = Pickler::default();
            p.int(v);
            let got: String = p.out.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(got, want, "{v}");
            let parsed = crate::checkpoint::pickle::unpickle(&[&p.out[..], b"."].concat());
            if let Ok(i) = i64::try_from(v) {
                assert_eq!(parsed, Ok(crate::checkpoint::pickle::Value::Int(i)));
            }
        }
    }

    #[test]
    fn archive_names_follow_torch() {
        let name = |p: &str| archive_name(Path::new(p)).ok();
        assert_eq!(name("/x/codec.pth").as_deref(), Some("codec"));
        assert_eq!(name("x.y.pth").as_deref(), Some("x.y"));
        assert_eq!(name("noext").as_deref(), Some("noext"));
        assert_eq!(name(".hidden"), None);
    }

    #[test]
    fn strides_treat_empty_dims_as_one() {
        assert_eq!(contiguous_strides(&[2, 0, 3]), [3, 3, 1]);
        assert_eq!(contiguous_strides(&[]), [] as [usize; 0]);
        assert_eq!(contiguous_strides(&[4, 5, 6]), [30, 6, 1]);
    }
}
