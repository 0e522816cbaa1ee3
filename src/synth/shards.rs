//! Writes tensors as sharded safetensors plus `model.safetensors.index.json`, the way
//! Hugging Face releases are laid out: tensors in order, a new shard once the current one holds
//! the target size, so one layer's tensors can straddle two shards.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use serde_json::{Value, json};

use crate::checkpoint::safetensors::INDEX_FILE;
use crate::checkpoint::safetensors_writer::{TensorHeader, write_safetensors};
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
        let headers: Vec<TensorHeader<'_>> = members
            .iter()
            .map(|&i| TensorHeader { name: &specs[i].name, dtype: specs[i].stored, shape: &specs[i].shape })
            .collect();
        write_safetensors(&dir.join(&name), &headers, |j| bytes_of(&specs[members[j]]))?;
        for &i in members {
            weight_map.insert(specs[i].name.clone(), Value::String(name.clone()));
        }
    }
    let total: usize = specs.iter().map(TensorSpec::stored_bytes).sum();
    let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
    std::fs::write(dir.join(INDEX_FILE), serde_json::to_string_pretty(&index)? + "\n")
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
