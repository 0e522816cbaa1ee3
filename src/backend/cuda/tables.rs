//! The decode batch's small per-call tables (row r → its own state's addresses, row r → its
//! position) kept where a captured CUDA graph of the batch step reads them.
//!
//! Eagerly, each call stages its table into pool scratch with a pageable copy
//! ([`Cuda::stage_to_device`]). A capture cannot record that copy, and the table must outlive the
//! capture at a fixed address. So while a [`TableArena`] records ([`Cuda::record_tables`]), every
//! table goes to the arena's next free bytes on the device and into its host image instead; the
//! captured kernels read them there. Between replays the caller advances the image's position
//! lanes (every row is one decode row further on) and uploads it before the next replay, in
//! stream order.
//!
//! The addresses in a table stay right only while the same streams step in the same rows: a
//! captured step is replayed for one set of streams (`engine::cuda_draws`).

use std::ops::Range;
use std::sync::Arc;

use super::Cuda;
use super::budget::Budget;
use super::memory::{DeviceBuffer, MemoryError, PoolBuf};

/// Tables start on 16-byte boundaries (the kernels read them as `u64` and `i32` arrays).
const TABLE_ALIGN_WORDS: usize = 4;

/// A fixed device buffer and its host image, filled in the order a recorded step stages its
/// tables.
pub struct TableArena {
    buffer: DeviceBuffer,
    image: TableImage,
}

impl TableArena {
    pub fn new(budget: &Arc<Budget>, bytes: usize) -> Result<TableArena, MemoryError> {
        let buffer = DeviceBuffer::alloc(budget, "batch step tables", bytes)?;
        Ok(TableArena { buffer, image: TableImage::default() })
    }

    /// Forgets every table (a new step is about to be recorded).
    pub fn clear(&mut self) {
        self.image = TableImage::default();
    }

    /// Moves every recorded position one row on (the step after the one recorded).
    pub fn advance_positions(&mut self) {
        self.image.advance_positions();
    }

    /// Queues the image's upload on `cuda`'s stream (before the replay that reads it).
    pub fn upload(&self, cuda: &Cuda) {
        if !self.image.words.is_empty() {
            cuda.stage_to_device(self.buffer.ptr(), &self.image.words);
        }
    }

    /// Appends a table (see [`TableImage::push`]); returns its device address.
    ///
    /// # Panics
    /// If the arena is full (its size is set from the model's layers and the batch's rows).
    fn push(&mut self, words: &[u64], positions: Range<usize>) -> u64 {
        let offset = self.image.push(words, positions);
        assert!(
            self.image.words.len() * 4 <= self.buffer.bytes(),
            "the batch step's tables outgrew their arena of {} bytes",
            self.buffer.bytes()
        );
        self.buffer.ptr() + offset as u64
    }
}

/// The arena's contents on the host: `u32` words as the device reads them, and which of them are
/// decode positions.
#[derive(Default)]
struct TableImage {
    words: Vec<u32>,
    /// Indices of the `i32` position words.
    positions: Vec<usize>,
}

impl TableImage {
    /// Appends `words` on a 16-byte boundary, their `i32` lanes `positions` (counted from the
    /// table's start) marked as decode positions; returns the table's byte offset.
    fn push(&mut self, words: &[u64], positions: Range<usize>) -> usize {
        assert!(positions.end <= 2 * words.len(), "position lanes past the table");
        let start = self.words.len().next_multiple_of(TABLE_ALIGN_WORDS);
        self.words.resize(start, 0);
        // Little-endian lanes, as the device reads the words.
        self.words.extend(words.iter().flat_map(|&w| [w as u32, (w >> 32) as u32]));
        self.positions.extend(positions.map(|lane| start + lane));
        start * 4
    }

    fn advance_positions(&mut self) {
        for &i in &self.positions {
            self.words[i] = (self.words[i] as i32 + 1) as u32;
        }
    }
}

/// A staged table: pool scratch (eager) or a place in the recording arena.
pub enum StagedTable {
    Pool(PoolBuf),
    Arena(u64),
}

impl StagedTable {
    pub fn ptr(&self) -> u64 {
        match self {
            StagedTable::Pool(buf) => buf.ptr(),
            StagedTable::Arena(ptr) => *ptr,
        }
    }
}

impl Cuda {
    /// Stages a small table of `words` for the kernels of one call; `positions` are the `i32`
    /// lanes (from the table's start) holding decode positions. Eagerly, into pool scratch
    /// without a sync; while an arena records, into the arena.
    pub fn stage_table(&self, words: &[u64], positions: Range<usize>) -> StagedTable {
        let mut recording = self.tables.lock().expect("tables lock");
        match recording.as_mut() {
            Some(arena) => StagedTable::Arena(arena.push(words, positions)),
            None => {
                drop(recording);
                let buf = self.scratch(words.len().max(1) * 8);
                if !words.is_empty() {
                    self.stage_to_device(buf.ptr(), words);
                }
                StagedTable::Pool(buf)
            }
        }
    }

    /// Runs `record` with every [`Cuda::stage_table`] going to `arena` (cleared first); returns
    /// what `record` returns and the filled arena.
    pub fn record_tables<T>(&self, mut arena: TableArena, record: impl FnOnce() -> T) -> (T, TableArena) {
        arena.clear();
        let previous = self.tables.lock().expect("tables lock").replace(arena);
        assert!(previous.is_none(), "tables are already being recorded");
        // Stops the recording even if `record` panics (the arena is then dropped).
        struct Stop<'a>(&'a Cuda);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                if let Ok(mut tables) = self.0.tables.lock() {
                    tables.take();
                }
            }
        }
        let stop = Stop(self);
        let out = record();
        let arena = self.tables.lock().expect("tables lock").take().expect("the arena records until here");
        drop(stop);
        (out, arena)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(image: &TableImage, byte_offset: usize, lane: usize) -> u32 {
        image.words[byte_offset / 4 + lane]
    }

    #[test]
    fn tables_start_aligned_and_keep_their_words() {
        let mut image = TableImage::default();
        let first = image.push(&[0x1111_2222_3333_4444], 0..0);
        let second = image.push(&[7, 0xdead_beef_0000_0005], 2..4);
        assert_eq!(first, 0);
        assert_eq!(second, 16, "the second table starts on the next 16-byte boundary");
        assert_eq!(lane(&image, first, 0), 0x3333_4444, "low half first");
        assert_eq!(lane(&image, first, 1), 0x1111_2222);
        assert_eq!((lane(&image, second, 2), lane(&image, second, 3)), (5, 0xdead_beef));
    }

    #[test]
    fn only_position_lanes_advance() {
        let mut image = TableImage::default();
        // Two rows' addresses, then their positions 9 and −1 packed in one word.
        let packed = u64::from(9u32) | (u64::from((-1i32) as u32) << 32);
        let offset = image.push(&[0xa0, 0xb0, packed], 4..6);
        image.advance_positions();
        image.advance_positions();
        assert_eq!(lane(&image, offset, 0), 0xa0, "addresses stay");
        assert_eq!(lane(&image, offset, 2), 0xb0);
        assert_eq!(lane(&image, offset, 4) as i32, 11);
        assert_eq!(lane(&image, offset, 5) as i32, 1);
    }
}
