//! safetensors shards: a memory-mapped file and a hand-parsed, bounds-checked header, plus the
//! `model.safetensors.index.json` that maps tensor names to shards.
//!
//! Header format: u64 little-endian length `n`, then `n` bytes of JSON mapping each tensor name
//! to `{dtype, shape, data_offsets: [begin, end]}` (offsets relative to the data after the
//! header), plus an optional `__metadata__` string map.

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde_json::Value;

use super::{Dtype, TensorView};

/// Headers larger than this are refused before parsing (the real ones are a few hundred KiB).
const MAX_HEADER_BYTES: u64 = 100 << 20;

/// Why a shard or index was refused; always names the file and, where known, the tensor.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    #[error("{file}: {message}")]
    File { file: String, message: String },
    #[error("{file}: tensor `{tensor}`: {message}")]
    Tensor { file: String, tensor: String, message: String },
}

fn file_err(path: &Path, message: impl Into<String>) -> SafetensorsError {
    SafetensorsError::File { file: path.display().to_string(), message: message.into() }
}

fn tensor_err(path: &Path, tensor: &str, message: impl Into<String>) -> SafetensorsError {
    SafetensorsError::Tensor { file: path.display().to_string(), tensor: tensor.to_owned(), message: message.into() }
}

/// One tensor's entry in a shard header, with its byte range resolved to the whole file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub bytes: Range<usize>,
}

/// A mapped shard whose header has been fully validated.
pub struct SafetensorsFile {
    path: PathBuf,
    mmap: Mmap,
    tensors: BTreeMap<String, TensorInfo>,
}

impl SafetensorsFile {
    pub fn open(path: &Path) -> Result<SafetensorsFile, SafetensorsError> {
        let file = File::open(path).map_err(|e| file_err(path, format!("cannot open: {e}")))?;
        // SAFETY: the file is opened read-only and checkpoints are never modified while a server
        // runs; a concurrent truncation would be an operator error that SIGBUS makes loud.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| file_err(path, format!("cannot map: {e}")))?;
        let tensors = parse_header(path, &mmap)?;
        Ok(SafetensorsFile { path: path.to_owned(), mmap, tensors })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn tensors(&self) -> &BTreeMap<String, TensorInfo> {
        &self.tensors
    }

    /// The whole file as mapped (page-aligned): the file-order load asks it which pages the
    /// page cache holds, and reads an element split across two of its pieces from it.
    pub fn mapped(&self) -> &[u8] {
        &self.mmap
    }

    pub fn view(&self, name: &str) -> Option<TensorView<'_>> {
        self.tensors.get(name).map(|t| TensorView {
            dtype: t.dtype,
            shape: &t.shape,
            bytes: &self.mmap[t.bytes.clone()],
        })
    }
}

/// Parses and validates the header of a whole mapped file.
pub fn parse_header(path: &Path, file: &[u8]) -> Result<BTreeMap<String, TensorInfo>, SafetensorsError> {
    let len_bytes: [u8; 8] = file
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| file_err(path, format!("file is {} bytes, too short for a safetensors header", file.len())))?;
    let header_len = u64::from_le_bytes(len_bytes);
    let available = file.len() as u64 - 8;
    if header_len > available || header_len > MAX_HEADER_BYTES {
        return Err(file_err(
            path,
            format!(
                "header length {header_len} runs past the end of the file ({available} bytes after the length field)"
            ),
        ));
    }
    let header_end = 8 + header_len as usize;
    let json: Value = serde_json::from_slice(&file[8..header_end])
        .map_err(|e| file_err(path, format!("header is not valid JSON: {e}")))?;
    let Value::Object(entries) = json else {
        return Err(file_err(path, "header is not a JSON object"));
    };
    let data_len = file.len() - header_end;
    let mut tensors = BTreeMap::new();
    for (name, entry) in entries {
        if name == "__metadata__" {
            check_metadata(path, &entry)?;
            continue;
        }
        let info = parse_entry(path, &name, &entry, data_len)?;
        let absolute = TensorInfo { bytes: header_end + info.bytes.start..header_end + info.bytes.end, ..info };
        tensors.insert(name, absolute);
    }
    check_no_overlap(path, &tensors)?;
    Ok(tensors)
}

fn check_metadata(path: &Path, entry: &Value) -> Result<(), SafetensorsError> {
    match entry {
        Value::Object(m) if m.values().all(Value::is_string) => Ok(()),
        _ => Err(file_err(path, "`__metadata__` must be a map of strings")),
    }
}

fn parse_entry(path: &Path, name: &str, entry: &Value, data_len: usize) -> Result<TensorInfo, SafetensorsError> {
    let err = |m: String| tensor_err(path, name, m);
    let obj = entry.as_object().ok_or_else(|| err("entry is not an object".into()))?;
    let dtype_name = obj.get("dtype").and_then(Value::as_str).ok_or_else(|| err("missing string `dtype`".into()))?;
    let dtype =
        Dtype::from_safetensors_name(dtype_name).ok_or_else(|| err(format!("unsupported dtype {dtype_name}")))?;
    let shape = obj
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| err("missing array `shape`".into()))?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| err("`shape` must hold non-negative integers".into()))?;
    let offsets = obj
        .get("data_offsets")
        .and_then(Value::as_array)
        .filter(|a| a.len() == 2)
        .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)))
        .ok_or_else(|| err("`data_offsets` must be two non-negative integers".into()))?;
    let (begin, end) = (offsets.0 as usize, offsets.1 as usize);
    if begin > end || end > data_len {
        return Err(err(format!("data_offsets [{begin}, {end}] lie outside the {data_len} data bytes of the file")));
    }
    let expected = shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| err(format!("shape {shape:?} overflows")))?;
    if expected != end - begin {
        return Err(err(format!(
            "shape {shape:?} of {dtype} needs {expected} bytes but data_offsets [{begin}, {end}] span {}",
            end - begin
        )));
    }
    Ok(TensorInfo { dtype, shape, bytes: begin..end })
}

fn check_no_overlap(path: &Path, tensors: &BTreeMap<String, TensorInfo>) -> Result<(), SafetensorsError> {
    let mut by_start: Vec<(&String, &TensorInfo)> = tensors.iter().filter(|(_, t)| !t.bytes.is_empty()).collect();
    by_start.sort_by_key(|(_, t)| t.bytes.start);
    for pair in by_start.windows(2) {
        let ((a, ta), (b, tb)) = (pair[0], pair[1]);
        if tb.bytes.start < ta.bytes.end {
            return Err(tensor_err(path, b, format!("data overlaps tensor `{a}`")));
        }
    }
    Ok(())
}

/// All shards of a checkpoint directory, addressed by tensor name.
pub struct ShardedCheckpoint {
    shards: Vec<SafetensorsFile>,
    /// Tensor name → index into `shards`.
    index: BTreeMap<String, usize>,
}

/// The index file of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The single-file alternative when a checkpoint is not sharded.
pub const SINGLE_FILE: &str = "model.safetensors";

impl ShardedCheckpoint {
    /// Opens `dir/model.safetensors.index.json` and every shard it names (or `dir/model.safetensors`).
    pub fn open(dir: &Path) -> Result<ShardedCheckpoint, SafetensorsError> {
        let index_path = dir.join(INDEX_FILE);
        if !index_path.exists() && dir.join(SINGLE_FILE).exists() {
            let shard = SafetensorsFile::open(&dir.join(SINGLE_FILE))?;
            let index = shard.tensors().keys().map(|k| (k.clone(), 0)).collect();
            return Ok(ShardedCheckpoint { shards: vec![shard], index });
        }
        let weight_map = read_weight_map(&index_path)?;
        let mut file_ids: BTreeMap<&str, usize> = BTreeMap::new();
        let mut shards = Vec::new();
        for file in weight_map.values() {
            if !file_ids.contains_key(file.as_str()) {
                file_ids.insert(file, shards.len());
                shards.push(SafetensorsFile::open(&dir.join(file))?);
            }
        }
        let mut index = BTreeMap::new();
        for (tensor, file) in &weight_map {
            let id = file_ids[file.as_str()];
            if !shards[id].tensors().contains_key(tensor) {
                return Err(tensor_err(
                    &index_path,
                    tensor,
                    format!("listed in the index under {file}, which does not contain it"),
                ));
            }
            index.insert(tensor.clone(), id);
        }
        for shard in &shards {
            for name in shard.tensors().keys() {
                if index.get(name).is_none_or(|&id| shards[id].path() != shard.path()) {
                    return Err(tensor_err(
                        shard.path(),
                        name,
                        format!("is not listed under this file in {INDEX_FILE}"),
                    ));
                }
            }
        }
        Ok(ShardedCheckpoint { shards, index })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// The tensor and the shard that holds it.
    pub fn get(&self, name: &str) -> Option<(&Path, TensorView<'_>)> {
        let shard = &self.shards[*self.index.get(name)?];
        Some((shard.path(), shard.view(name)?))
    }

    /// The shard files, each once, in the order the index first names them.
    pub fn files(&self) -> &[SafetensorsFile] {
        &self.shards
    }

    pub fn shard_paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(SafetensorsFile::path)
    }
}

fn read_weight_map(index_path: &Path) -> Result<BTreeMap<String, String>, SafetensorsError> {
    let text = std::fs::read_to_string(index_path).map_err(|e| file_err(index_path, format!("cannot read: {e}")))?;
    let json: Value = serde_json::from_str(&text).map_err(|e| file_err(index_path, format!("not valid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| file_err(index_path, "missing object `weight_map`"))?;
    let mut out = BTreeMap::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| tensor_err(index_path, tensor, "shard name is not a string"))?;
        // Shard names are plain file names beside the index; anything else could escape the directory.
        if file.is_empty() || file.contains(['/', '\\']) || file == "." || file == ".." {
            return Err(tensor_err(index_path, tensor, format!("shard name {file:?} is not a plain file name")));
        }
        out.insert(tensor.clone(), file.to_owned());
    }
    Ok(out)
}
