//! Reads a `torch.save` zip archive (e.g. `codec.pth`) into named, bounds-checked strided tensor views
//! over a read-only memory map, through the restricted unpickler (`codec.md` §4).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Cursor};
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use zip::{CompressionMethod, ZipArchive};

use super::pickle::{self, PickleError, TensorRef, Value};
use super::{Dtype, TensorView};

/// A tensor in the archive: a strided view (units of elements) into one storage record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PthTensor {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    /// Offset of the first element inside the storage, in elements.
    pub storage_offset: usize,
    /// Absolute byte range of the whole storage record in the file.
    pub storage: Range<usize>,
}

impl PthTensor {
    pub fn numel(&self) -> usize {
        // Cannot overflow: checked when the archive was opened.
        self.shape.iter().product()
    }

    /// Row-major contiguity as PyTorch defines it (strides of size-1 dims do not matter).
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1;
        for (&size, &stride) in self.shape.iter().zip(&self.strides).rev() {
            if size != 1 && stride != expected {
                return false;
            }
            expected *= size;
        }
        true
    }
}

/// An error reading a `.pth` file; its message always starts with the file's path.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", path.display())]
pub struct PthError {
    pub path: PathBuf,
    pub kind: PthErrorKind,
}

#[derive(Debug, thiserror::Error)]
pub enum PthErrorKind {
    #[error("cannot read the file: {0}")]
    Io(#[source] io::Error),
    #[error("not a readable zip archive: {0}")]
    Zip(String),
    #[error("zip entry `{entry}` is compressed ({method}); torch.save stores records uncompressed")]
    Compressed { entry: String, method: String },
    #[error("zip entry `{entry}`: {why}")]
    Entry { entry: String, why: String },
    #[error("the archive's first entry `{0}` is not inside a top-level folder")]
    NoPrefix(String),
    #[error("record `{0}` is missing")]
    MissingRecord(String),
    #[error("record `byteorder` says {0:?}; only little-endian checkpoints are supported")]
    ByteOrder(String),
    #[error("data.pkl: {0}")]
    Pickle(#[from] PickleError),
    #[error("the pickled object is a {0}, not a state dict")]
    NotStateDict(&'static str),
    #[error("state-dict key of type {0} (keys must be strings)")]
    NonStringKey(&'static str),
    #[error("state-dict entry `{key}` is a {found}, not a tensor")]
    NotATensor { key: String, found: &'static str },
    #[error("state-dict key `{0}` appears twice")]
    DuplicateKey(String),
    #[error("tensor `{tensor}`: storage `{storage}` (record `{record}`) is missing from the archive")]
    MissingStorage { tensor: String, storage: String, record: String },
    #[error("tensor `{tensor}`: {why}")]
    Tensor { tensor: String, why: String },
    #[error("tensor `{0}` is not in the archive")]
    NotFound(String),
}

/// A `torch.save` archive mapped into memory, with its tensors resolved and checked.
pub struct PthArchive {
    path: PathBuf,
    map: Mmap,
    /// In pickle (file) order.
    tensors: Vec<(String, PthTensor)>,
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for PthArchive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PthArchive").field("path", &self.path).field("tensors", &self.tensors.len()).finish()
    }
}

impl PthArchive {
    /// Maps `path`, checks the zip layout, unpickles `data.pkl` and resolves every tensor.
    pub fn open(path: &Path) -> Result<PthArchive, PthError> {
        let path = path.to_path_buf();
        let fail = |kind| PthError { path: path.clone(), kind };
        let file = File::open(&path).map_err(|e| fail(PthErrorKind::Io(e)))?;
        // SAFETY: the file is opened read-only and this process never modifies it while it is mapped;
        // like every mmap reader we assume no other process truncates or rewrites it meanwhile.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| fail(PthErrorKind::Io(e)))?;
        let tensors = resolve_tensors(&map).map_err(fail)?;
        let index = tensors.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        Ok(PthArchive { path, map, tensors, index })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Every tensor, in the order the state dict was pickled (the file's order).
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &PthTensor)> {
        self.tensors.iter().map(|(k, t)| (k.as_str(), t))
    }

    pub fn get(&self, name: &str) -> Option<&PthTensor> {
        self.index.get(name).map(|&i| &self.tensors[i].1)
    }

    /// The tensor's elements in row-major order: borrowed from the map when the view is contiguous,
    /// otherwise gathered into a new buffer. Panics if `t` does not come from this archive.
    pub fn contiguous_bytes(&self, t: &PthTensor) -> Cow<'_, [u8]> {
        let n = t.numel();
        if n == 0 {
            return Cow::Borrowed(&[]);
        }
        let es = t.dtype.size();
        let storage = &self.map[t.storage.clone()];
        if t.is_contiguous() {
            let start = t.storage_offset * es;
            return Cow::Borrowed(&storage[start..start + n * es]);
        }
        let mut out = Vec::with_capacity(n * es);
        let mut idx = vec![0usize; t.shape.len()];
        for _ in 0..n {
            let elem = t.storage_offset + idx.iter().zip(&t.strides).map(|(i, s)| i * s).sum::<usize>();
            out.extend_from_slice(&storage[elem * es..(elem + 1) * es]);
            // Odometer increment, last dim fastest.
            for d in (0..idx.len()).rev() {
                idx[d] += 1;
                if idx[d] < t.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Cow::Owned(out)
    }

    /// The named F32/F16/BF16 tensor as row-major f32 values (exact conversion).
    pub fn to_f32_vec(&self, name: &str) -> Result<Vec<f32>, PthError> {
        let fail = |kind| PthError { path: self.path.clone(), kind };
        let t = self.get(name).ok_or_else(|| fail(PthErrorKind::NotFound(name.to_owned())))?;
        if !matches!(t.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
            let why = format!("is {}, not F32, F16 or BF16", t.dtype);
            return Err(fail(PthErrorKind::Tensor { tensor: name.to_owned(), why }));
        }
        let bytes = self.contiguous_bytes(t);
        let view = TensorView { dtype: t.dtype, shape: &t.shape, bytes: &bytes };
        Ok(view.to_f32_vec().expect("float dtype checked above"))
    }
}

/// Record name → absolute byte range of its (stored) data, plus the archive's folder name.
struct Records {
    prefix: String,
    ranges: HashMap<String, Range<usize>>,
}

impl Records {
    fn read(map: &[u8]) -> Result<Records, PthErrorKind> {
        let zip_err = |e: zip::result::ZipError| PthErrorKind::Zip(e.to_string());
        let mut zip = ZipArchive::new(Cursor::new(map)).map_err(zip_err)?;
        let mut prefix = None;
        let mut ranges = HashMap::new();
        for i in 0..zip.len() {
            let f = zip.by_index_raw(i).map_err(zip_err)?;
            let name = f.name().map_err(zip_err)?.into_owned();
            let entry = |why: &str| PthErrorKind::Entry { entry: name.clone(), why: why.into() };
            if f.compression() != CompressionMethod::Stored {
                return Err(PthErrorKind::Compressed { entry: name, method: f.compression().to_string() });
            }
            if f.compressed_size() != f.size() {
                return Err(entry("stored entry whose compressed and uncompressed sizes differ"));
            }
            let start = f.data_start().ok_or_else(|| entry("data offset unknown"))?;
            let end = start.checked_add(f.size()).filter(|&e| e <= map.len() as u64);
            let end = end.ok_or_else(|| entry("data runs past the end of the file"))?;
            if prefix.is_none() {
                // PyTorch's reader takes the folder from the first entry's name; so do we.
                let p = name.split_once('/').map(|(p, _)| p.to_owned());
                prefix = Some(p.ok_or_else(|| PthErrorKind::NoPrefix(name.clone()))?);
            }
            ranges.insert(name, start as usize..end as usize);
        }
        let prefix = prefix.ok_or(PthErrorKind::Zip("the archive has no entries".into()))?;
        Ok(Records { prefix, ranges })
    }

    fn get(&self, record: &str) -> Option<Range<usize>> {
        self.ranges.get(&format!("{}/{record}", self.prefix)).cloned()
    }
}

/// Every tensor of an archive's bytes (what [`PthArchive::open`] maps), in pickle order: the zip
/// layout checked, `data.pkl` unpickled, each view checked against its storage. Public for the
/// fuzz target (`fuzz/fuzz_targets/pth.rs`).
pub fn resolve_tensors(map: &[u8]) -> Result<Vec<(String, PthTensor)>, PthErrorKind> {
    let records = Records::read(map)?;
    let missing = |r: &str| PthErrorKind::MissingRecord(format!("{}/{r}", records.prefix));
    if let Some(r) = records.get("byteorder")
        && map[r.clone()] != *b"little"
    {
        let shown = &map[r.start..r.end.min(r.start + 32)];
        return Err(PthErrorKind::ByteOrder(String::from_utf8_lossy(shown).into_owned()));
    }
    let pkl = records.get("data.pkl").ok_or_else(|| missing("data.pkl"))?;
    let top = pickle::unpickle(&map[pkl])?;
    let entries = state_dict_entries(&top)?;

    let mut seen: HashMap<&str, (Dtype, u64)> = HashMap::new();
    let mut out = Vec::with_capacity(entries.len());
    for (name, t) in entries {
        let s = &t.storage;
        let record = format!("{}/data/{}", records.prefix, s.key);
        let Some(range) = records.get(&format!("data/{}", s.key)) else {
            return Err(PthErrorKind::MissingStorage { tensor: name, storage: s.key.clone(), record });
        };
        let bad = |why: String| PthErrorKind::Tensor { tensor: name.clone(), why };
        // Two tensors may share a storage, but must agree on what it is.
        if let Some(&(dtype, numel)) = seen.get(s.key.as_str())
            && (dtype, numel) != (s.dtype, s.numel)
        {
            return Err(bad(format!("storage `{}` is also used as {numel} × {dtype}", s.key)));
        }
        seen.insert(&s.key, (s.dtype, s.numel));
        let expected = usize::try_from(s.numel).ok().and_then(|n| n.checked_mul(s.dtype.size()));
        if expected != Some(range.len()) {
            return Err(bad(format!(
                "storage `{}` should hold {} × {} ({} bytes) but record `{record}` has {} bytes",
                s.key,
                s.numel,
                s.dtype,
                expected.map_or("too many".into(), |b| b.to_string()),
                range.len()
            )));
        }
        check_view(t, s.numel as usize).map_err(bad)?;
        let tensor = PthTensor {
            dtype: s.dtype,
            shape: t.shape.clone(),
            strides: t.strides.clone(),
            storage_offset: t.storage_offset,
            storage: range,
        };
        out.push((name, tensor));
    }
    Ok(out)
}

/// Flattens the unpickled object into `(name, tensor)` pairs, unwrapping `{"state_dict": …}` and a
/// `generator.` prefix shared by every key (layouts fish-speech's loader accepts).
fn state_dict_entries(top: &Value) -> Result<Vec<(String, &TensorRef)>, PthErrorKind> {
    let Some(mut dict) = top.as_dict() else {
        return Err(PthErrorKind::NotStateDict(top.type_name()));
    };
    let wrapped = dict.items.iter().find(|(k, _)| k.as_str() == Some("state_dict"));
    if let Some((_, Value::Dict(inner))) = wrapped {
        dict = inner;
    }
    let mut entries = Vec::with_capacity(dict.items.len());
    let mut keys = HashSet::with_capacity(dict.items.len());
    for (k, v) in &dict.items {
        let Value::Str(key) = k else {
            return Err(PthErrorKind::NonStringKey(k.type_name()));
        };
        let Value::Tensor(t) = v else {
            return Err(PthErrorKind::NotATensor { key: key.to_string(), found: v.type_name() });
        };
        if !keys.insert(key.clone()) {
            return Err(PthErrorKind::DuplicateKey(key.to_string()));
        }
        entries.push((key.to_string(), &**t));
    }
    const GENERATOR: &str = "generator.";
    if !entries.is_empty() && entries.iter().all(|(k, _)| k.starts_with(GENERATOR)) {
        for (k, _) in &mut entries {
            k.drain(..GENERATOR.len());
        }
    }
    Ok(entries)
}

/// Checks that every element the view reaches lies inside its storage, with overflow-safe arithmetic.
fn check_view(t: &TensorRef, storage_numel: usize) -> Result<(), String> {
    let numel = t.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let numel = numel.ok_or("element count overflows")?;
    if numel == 0 {
        // Like PyTorch: an empty view reaches no element, whatever its offset.
        return Ok(());
    }
    // Broadcast (stride-0) or overlapping views could expand a small storage into an unbounded copy;
    // a state dict never holds one.
    if numel > storage_numel {
        return Err(format!("view of {numel} elements over a storage of {storage_numel}"));
    }
    let last = t.shape.iter().zip(&t.strides).try_fold(t.storage_offset, |acc, (&size, &stride)| {
        (size - 1).checked_mul(stride).and_then(|x| acc.checked_add(x))
    });
    match last {
        Some(last) if last < storage_numel => Ok(()),
        _ => Err(format!(
            "view (offset {}, shape {:?}, strides {:?}) reaches past its storage of {storage_numel} elements",
            t.storage_offset, t.shape, t.strides
        )),
    }
}
