//! Writes tensors as sharded safetensors plus `model.safetensors.index.json`, the way
//! Hugging Face releases are laid out: tensors in order, a new shard once the current one holds
//! the target size, so one layer's tensors can straddle two shards.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use serde_json::{Value, json};

use crate::checkpoint::safetensors::INDEX_FILE;
use crate::model::weights::TensorSpec;

/// Which specs go into which shard, in order.
pub fn plan_shards(specs: &[TensorSpec], shard_bytes: usize) -> Vec<Vec<usize>> {
    let mut shards: Vec<Vec<usize>> = vec![Vec::new()];
    let mut current = 0usize;
    for (i, s) in specs.iter().enumerate() {
        if current >= shard_bytes && !shards.last().is_some_and(Vec::is_empty) {
            shards.push(Vec::new());
            current = 0;
        }
        shards.last_mut().expect("at least one shard").push(i);
        current += s.stored_bytes();
    }
    shards
}

pub fn shard_name(index: usize, count: usize) -> String {
    format!("model-{:05}-of-{:05}.safetensors", index + 1, count)
}

/// Writes every shard and the index; `bytes_of` produces each tensor's stored bytes.
pub fn write_shards(
    dir: &Path,
    specs: &[TensorSpec],
    plan: &[Vec<usize>],
    mut bytes_of: impl FnMut(&TensorSpec) -> Vec<u8>,
) -> io::Result<()> {
    let mut weight_map = BTreeMap::new();
    for (k, members) in plan.iter().enumerate() {
        let name = shard_name(k, plan.len());
        let header = shard_header(specs, members);
        let mut w = BufWriter::with_capacity(8 << 20, File::create(dir.join(&name))?);
        w.write_all(&(header.len() as u64).to_le_bytes())?;
        w.write_all(&header)?;
        for &i in members {
            let bytes = bytes_of(&specs[i]);
            assert_eq!(bytes.len(), specs[i].stored_bytes(), "tensor `{}`", specs[i].name);
            w.write_all(&bytes)?;
            weight_map.insert(specs[i].name.clone(), Value::String(name.clone()));
        }
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    let total: usize = specs.iter().map(TensorSpec::stored_bytes).sum();
    let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
    std::fs::write(dir.join(INDEX_FILE), serde_json::to_string_pretty(&index)? + "\n")
}

/// The JSON header, space-padded to a multiple of 8 bytes as the reference writer does.
fn shard_header(specs: &[TensorSpec], members: &[usize]) -> Vec<u8> {
    let mut entries = serde_json::Map::new();
    entries.insert("__metadata__".into(), json!({ "format": "pt" }));
    let mut offset = 0usize;
    for &i in members {
        let s = &specs[i];
        let end = offset + s.stored_bytes();
        entries.insert(
            s.name.clone(),
            json!({ "dtype": s.stored.safetensors_name(), "shape": s.shape, "data_offsets": [offset, end] }),
        );
        offset = end;
    }
    let mut header = serde_json::to_vec(&Value::Object(entries)).expect("header serialises");
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    header
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Dtype;
    use crate::model::weights::{Accept, Init};

    #[test]
    fn plan_splits_by_size_and_keeps_order() {
        let specs: Vec<TensorSpec> = (0..5)
            .map(|i| TensorSpec::new(format!("t{i}"), &[100], Accept::Bf16, Dtype::BF16, Init::ZeroCenteredGain))
            .collect();
        let plan = plan_shards(&specs, 400);
        assert_eq!(plan, vec![vec![0, 1], vec![2, 3], vec![4]]);
        assert_eq!(plan.concat(), (0..5).collect::<Vec<_>>());
    }
}
