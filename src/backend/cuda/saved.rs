//! `kernels/saved.cu`: saved request state on the GPU (`backend::saved`). Saves live in pages of
//! one arena reserved at start-up ([`Cuda::reserve_saved_states`]; its bytes are a term of the
//! memory plan), so keeping a voice's prefix makes no driver allocation while serving. One
//! `saved_copy_pieces` launch moves every piece of a save or a restore.
//!
//! A save is a byte stream: per state part its regions (a GDN layer's conv then recurrent state;
//! a KV cache's keys then values, cut to the saved positions), each starting 256-aligned, laid
//! over the save's pages in order. Pieces are the regions split at page boundaries.

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;

use super::Cuda;
use super::launch::{Dims, Kernel, KernelError, Module, embedded};
use super::memory::{DeviceBuffer, MemoryError};
use crate::backend::saved::{SavedStateOps, StatePart, StatePartMut};

/// Bytes of one arena page: a save takes whole pages.
pub const SAVED_PAGE_BYTES: usize = 1 << 20;
/// Where each region starts in a save's byte stream (keeps every piece 16-byte aligned for the
/// kernel's vector copies).
const REGION_ALIGN: usize = 256;
const THREADS: u32 = 256;

pub struct SavedKernels {
    copy_pieces: Kernel,
}

impl SavedKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<SavedKernels, KernelError> {
        let m = Module::load(ctx, "saved", embedded::SAVED)?;
        Ok(SavedKernels { copy_pieces: m.kernel("saved_copy_pieces")? })
    }
}

/// The pages saves are made of: one device buffer and its free pages.
pub struct SavedArena {
    buffer: DeviceBuffer,
    free: Mutex<Vec<u32>>,
    pages: usize,
}

impl SavedArena {
    /// An arena of `bytes` rounded down to whole pages, from the budget.
    pub fn reserve(cuda: &Cuda, bytes: usize) -> Result<SavedArena, MemoryError> {
        let pages = bytes / SAVED_PAGE_BYTES;
        let buffer = DeviceBuffer::alloc(cuda.budget(), "saved prefixes", pages.max(1) * SAVED_PAGE_BYTES)?;
        let free = (0..u32::try_from(pages).expect("page count fits u32")).rev().collect();
        Ok(SavedArena { buffer, free: Mutex::new(free), pages })
    }

    pub fn bytes(&self) -> usize {
        self.pages * SAVED_PAGE_BYTES
    }

    fn page_address(&self, page: u32) -> u64 {
        self.buffer.ptr() + (page as usize * SAVED_PAGE_BYTES) as u64
    }
}

/// A save: its pages (returned to the arena on drop) and the region sizes it holds.
pub struct GpuSaved {
    arena: Arc<SavedArena>,
    pages: Vec<u32>,
    regions: Vec<usize>,
    rows: usize,
}

impl Drop for GpuSaved {
    fn drop(&mut self) {
        // Work that reads these pages is queued on the one stream before any later save's copy
        // into them, so they are free to reuse at once.
        if let Ok(mut free) = self.arena.free.lock() {
            free.append(&mut self.pages);
        }
    }
}

/// `(address, bytes)` of each region of `part`, KV caches cut to `rows` positions.
fn regions(part: &StatePart<'_, Cuda>, rows: usize) -> Vec<(u64, usize)> {
    let kv = |c: &super::attention::GpuKvCache| {
        assert!(rows <= c.len, "a save of {rows} positions from a KV cache of {}", c.len);
        let bytes = rows * c.position_bytes();
        vec![(c.keys.ptr(), bytes), (c.values.ptr(), bytes)]
    };
    match part {
        StatePart::Gdn(s) => s.buffers().to_vec(),
        StatePart::Kv(c) => kv(c),
        StatePart::TowerKv(t) => kv(&t.cache),
    }
}

/// The regions a restore writes, with each KV cache's length set to `rows`.
fn regions_mut(part: &mut StatePartMut<'_, Cuda>, rows: usize) -> Vec<(u64, usize)> {
    let kv = |c: &mut super::attention::GpuKvCache| {
        assert!(rows <= c.capacity, "{rows} saved positions do not fit a KV cache of {}", c.capacity);
        c.len = rows;
        let bytes = rows * c.position_bytes();
        vec![(c.keys.ptr(), bytes), (c.values.ptr(), bytes)]
    };
    match part {
        StatePartMut::Gdn(s) => s.buffers().to_vec(),
        StatePartMut::Kv(c) => kv(c),
        StatePartMut::TowerKv(t) => kv(&mut t.cache),
    }
}

/// Bytes of a save's stream holding regions of `sizes`.
fn stream_bytes(sizes: impl Iterator<Item = usize>) -> usize {
    sizes.fold(0, |offset, bytes| offset.next_multiple_of(REGION_ALIGN) + bytes)
}

impl Cuda {
    /// Reserves `bytes` (whole pages) of device memory for saved request state; returns the
    /// bytes reserved. Call once, at start-up: saves made later take pages of it.
    pub fn reserve_saved_states(&self, bytes: usize) -> Result<usize, MemoryError> {
        let arena = SavedArena::reserve(self, bytes)?;
        let reserved = arena.bytes();
        *self.saved.lock().expect("saved-state lock") = Some(Arc::new(arena));
        Ok(reserved)
    }

    fn saved_arena(&self) -> Option<Arc<SavedArena>> {
        self.saved.lock().expect("saved-state lock").clone()
    }

    /// One launch copying `regions` to or from the pages of a save (`to_pages`: a save).
    fn copy_save(&self, arena: &SavedArena, pages: &[u32], regions: &[(u64, usize)], to_pages: bool) {
        let pages: Vec<u64> = pages.iter().map(|&p| arena.page_address(p)).collect();
        let table = piece_table(regions, &pages, to_pages);
        let pieces = table.len() / 3;
        if pieces == 0 {
            return;
        }
        let staged = self.scratch(table.len() * size_of::<u64>());
        self.stage_to_device(staged.ptr(), &table);
        let args = [staged.ptr().into(), i32::try_from(pieces).expect("piece count fits i32").into()];
        self.kernels.saved.copy_pieces.launch(self.stream(), Dims::linear(pieces, THREADS), &args);
    }
}

/// The kernel's table `{src, dst, bytes}` per piece: `regions` laid over the pages at addresses
/// `pages` in stream order (each region 256-aligned in the stream), split at page boundaries;
/// `to_pages` copies regions into the pages (a save), else pages into regions (a restore).
fn piece_table(regions: &[(u64, usize)], pages: &[u64], to_pages: bool) -> Vec<u64> {
    let mut table = Vec::new();
    let mut offset = 0usize;
    for &(address, bytes) in regions {
        offset = offset.next_multiple_of(REGION_ALIGN);
        let mut done = 0;
        while done < bytes {
            let at = offset + done;
            let within = at % SAVED_PAGE_BYTES;
            let n = (bytes - done).min(SAVED_PAGE_BYTES - within);
            let page = pages[at / SAVED_PAGE_BYTES] + within as u64;
            let state = address + done as u64;
            let (src, dst) = if to_pages { (state, page) } else { (page, state) };
            table.extend([src, dst, n as u64]);
            done += n;
        }
        offset += bytes;
    }
    table
}

impl SavedStateOps for Cuda {
    type Saved = GpuSaved;

    fn saved_footprint(&self, parts: &[StatePart<'_, Cuda>], rows: usize) -> usize {
        let bytes = stream_bytes(parts.iter().flat_map(|p| regions(p, rows)).map(|(_, b)| b));
        bytes.div_ceil(SAVED_PAGE_BYTES) * SAVED_PAGE_BYTES
    }

    fn saved_capacity(&self) -> Option<usize> {
        Some(self.saved_arena().map_or(0, |a| a.bytes()))
    }

    fn save_state(&self, parts: &[StatePart<'_, Cuda>], rows: usize) -> Option<GpuSaved> {
        let arena = self.saved_arena()?;
        let regions: Vec<(u64, usize)> = parts.iter().flat_map(|p| regions(p, rows)).collect();
        let needed = stream_bytes(regions.iter().map(|&(_, b)| b)).div_ceil(SAVED_PAGE_BYTES);
        let pages = {
            let mut free = arena.free.lock().expect("saved-state lock");
            if free.len() < needed {
                return None;
            }
            let at = free.len() - needed;
            free.split_off(at)
        };
        self.copy_save(&arena, &pages, &regions, true);
        let sizes = regions.iter().map(|&(_, b)| b).collect();
        Some(GpuSaved { arena, pages, regions: sizes, rows })
    }

    fn restore_state(&self, saved: &GpuSaved, parts: &mut [StatePartMut<'_, Cuda>]) {
        let regions: Vec<(u64, usize)> = parts.iter_mut().flat_map(|p| regions_mut(p, saved.rows)).collect();
        let sizes: Vec<usize> = regions.iter().map(|&(_, b)| b).collect();
        assert_eq!(sizes, saved.regions, "a restore into state of another model");
        self.copy_save(&saved.arena, &saved.pages, &regions, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte of every region lands once, inside one page, pieces 16-byte aligned on both
    /// sides, regions in order; a restore's table is the save's with source and target swapped.
    #[test]
    fn pieces_cover_each_region_once_within_pages() {
        const PAGE: u64 = SAVED_PAGE_BYTES as u64;
        // Regions as a state has them: a GDN conv and recurrent state, KV keys and values, an odd size.
        let regions = [(1 << 40, 96 << 10), (2 << 40, 2 << 20), (3 << 40, 5_120), (4 << 40, 5_120), (5 << 40, 48)];
        let bytes = stream_bytes(regions.iter().map(|&(_, b)| b));
        let pages: Vec<u64> = (0..bytes.div_ceil(SAVED_PAGE_BYTES) as u64).rev().map(|p| (100 + p) * PAGE).collect();
        let save = piece_table(&regions, &pages, true);
        let mut covered = vec![0usize; regions.len()];
        let mut last_end = None::<(usize, u64)>;
        for piece in save.chunks(3) {
            let (src, dst, n) = (piece[0], piece[1], piece[2]);
            assert!(n > 0 && src % 16 == 0 && dst % 16 == 0, "piece {piece:?}");
            assert_eq!((dst % PAGE + n - 1) / PAGE, 0, "a piece stays inside its page: {piece:?}");
            assert!(pages.contains(&(dst / PAGE * PAGE)));
            let r = regions.iter().position(|&(a, b)| src >= a && src + n <= a + b as u64).expect("inside a region");
            // Pieces of a region follow one another.
            if let Some((last_r, end)) = last_end
                && last_r == r
            {
                assert_eq!(src, end);
            }
            covered[r] += n as usize;
            last_end = Some((r, src + n));
        }
        assert_eq!(covered, regions.iter().map(|&(_, b)| b).collect::<Vec<_>>());
        let restore = piece_table(&regions, &pages, false);
        let swapped: Vec<u64> = save.chunks(3).flat_map(|p| [p[1], p[0], p[2]]).collect();
        assert_eq!(restore, swapped);
    }
}
