//! The attention decode's split counts: per (row, head set) of a launch, how many of its splits
//! have finished (`kernels/attention.cu`: the last one merges them).

use std::sync::Arc;

use crate::backend::cuda::Cuda;
use crate::backend::cuda::budget::Budget;
use crate::backend::cuda::memory::{DeviceBuffer, MemoryError};

/// Entries of [`MergeCounts`]: rows × head sets of one decode launch (`--max-batch` ≤ 4096 rows of
/// up to 16 head sets: Drama 3's 16 q heads two a CTA make 8).
pub const MERGE_COUNTS: usize = 1 << 16;

/// How many splits of each (row, head set) of a decode launch have finished, u32: the last one
/// merges them all (kernels/attention.cu) and resets its count, so every count is 0 between
/// launches. One table per stream handle ([`Cuda`]): launches on one stream run in order, and no
/// two streams share a table.
pub struct MergeCounts(DeviceBuffer);

impl MergeCounts {
    pub fn new(budget: &Arc<Budget>) -> Result<MergeCounts, MemoryError> {
        Ok(MergeCounts(DeviceBuffer::zeroed(budget, "attention merge counts", MERGE_COUNTS * 4)?))
    }

    /// The table's address for a launch of `entries` (row, head set) pairs.
    pub(in crate::backend::cuda) fn for_entries(&self, entries: usize) -> u64 {
        assert!(entries <= MERGE_COUNTS, "attention decode of {entries} (row, head set) pairs: at most {MERGE_COUNTS}");
        self.0.ptr()
    }
}

/// The split counts of `cuda`'s handle that are not 0 (after a sync): none, unless a decode
/// launch left a merge undone.
pub fn merge_counts_left(cuda: &Cuda) -> usize {
    cuda.copy_to_host::<u32>(cuda.merge_counts.0.ptr(), MERGE_COUNTS).iter().filter(|&&c| c != 0).count()
}
