//! Prompt prefixes kept across requests: the state after a voice's rows, so a request in a saved
//! voice prefills only its own rows.
//!
//! A prompt with voice references starts with its system message: the instruction and every
//! reference's transcript and code rows (`request::prompt`). Every request in that voice shares
//! those rows. The engine runs them as their own chunks (a chunk never crosses the prefix's end,
//! [`SharedPrefix::chunk_end`]), so the state after them depends on those rows alone and is the
//! same for every such request. [`PrefixCache`] keeps a copy of it (`backend::saved`), least
//! recently used out first within a byte budget, and a later request starts from a copy of that
//! state instead of running the rows again. Since the chunks are the same with and without the
//! cache, a request's bytes are the same either way, bit for bit.
//!
//! The key is the prefix's rows plus the row after them: the tower writes a prompt row labelled
//! by its successor (`Engine::prefill_streams`), so the saved tower state depends on that row too.
//! Keys are compared whole, never by hash alone.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::backend::Backend;
use crate::backend::saved::{StatePart, StatePartMut};
use crate::model::backbone::{BackboneState, LayerState};
use crate::model::frame::Rows;
use crate::model::tower::TowerState;

/// The part of a prompt other prompts share: its first `rows` rows. Prefill chunks restart at
/// their end; with `keep`, the state after them is kept in the engine's [`PrefixCache`] (when it
/// has one) and restored for the next prompt with the same prefix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedPrefix {
    pub rows: usize,
    pub keep: bool,
}

impl SharedPrefix {
    /// No shared rows: chunks run from the prompt's start, nothing is kept.
    pub const NONE: SharedPrefix = SharedPrefix { rows: 0, keep: false };

    /// Where the prefill chunk that starts at row `done` of a `total`-row prompt ends, taking at
    /// most `chunk` rows: never past the prefix's end while inside it.
    pub fn chunk_end(&self, done: usize, total: usize, chunk: usize) -> usize {
        let end = (done + chunk).min(total);
        if done < self.rows { end.min(self.rows) } else { end }
    }

    /// Whether `rows` can use a kept prefix: it is asked for, and the prompt goes on past it
    /// (the key holds the row after the prefix).
    fn applies_to(&self, rows: &Rows) -> bool {
        self.keep && self.rows > 0 && self.rows < rows.len()
    }
}

/// Counters of a [`PrefixCache`], for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Prefixes held now, and the bytes they take.
    pub entries: usize,
    pub bytes: usize,
    /// The byte budget.
    pub budget: usize,
    /// Requests that started from a kept prefix, and requests that asked and ran it instead.
    pub hits: u64,
    pub misses: u64,
    /// Prefixes saved, and prefixes dropped to make room.
    pub saved: u64,
    pub evicted: u64,
    /// Prefixes not kept because one alone is larger than the budget.
    pub too_large: u64,
}

struct Entry<B: Backend> {
    saved: B::Saved,
    bytes: usize,
    last_used: u64,
}

struct Inner<B: Backend> {
    entries: HashMap<Box<[u32]>, Entry<B>>,
    clock: u64,
    stats: PrefixCacheStats,
}

/// Saved prefix states, least recently used out first, within a byte budget.
pub struct PrefixCache<'w, B: Backend> {
    backend: &'w B,
    inner: RefCell<Inner<B>>,
}

impl<'w, B: Backend> PrefixCache<'w, B> {
    /// A cache of at most `budget` bytes (and no more than the backend has room for).
    pub fn new(backend: &'w B, budget: usize) -> PrefixCache<'w, B> {
        let budget = backend.saved_capacity().map_or(budget, |room| room.min(budget));
        let stats = PrefixCacheStats { budget, ..PrefixCacheStats::default() };
        PrefixCache { backend, inner: RefCell::new(Inner { entries: HashMap::new(), clock: 0, stats }) }
    }

    pub fn stats(&self) -> PrefixCacheStats {
        self.inner.borrow().stats
    }

    /// Drops every kept prefix.
    pub fn clear(&self) {
        let mut inner = self.inner.borrow_mut();
        inner.entries.clear();
        inner.stats.entries = 0;
        inner.stats.bytes = 0;
    }

    /// Starts a new request's fresh state from the kept prefix of `rows`, if there is one.
    /// Returns the rows restored (0: none; the prompt runs from its start).
    pub fn restore(
        &self,
        rows: &Rows,
        prefix: SharedPrefix,
        backbone: &mut BackboneState<B>,
        tower: &mut TowerState<B>,
    ) -> usize {
        if !prefix.applies_to(rows) {
            return 0;
        }
        let mut inner = self.inner.borrow_mut();
        let inner = &mut *inner;
        inner.clock += 1;
        let Some(entry) = inner.entries.get_mut(key(rows, prefix).as_slice()) else {
            inner.stats.misses += 1;
            return 0;
        };
        entry.last_used = inner.clock;
        inner.stats.hits += 1;
        self.backend.restore_state(&entry.saved, &mut parts_mut(backbone, tower));
        backbone.position = prefix.rows;
        tower.restored(prefix.rows);
        prefix.rows
    }

    /// Keeps the state of a request that has just run exactly the prefix of `rows` (unless an
    /// equal prefix is kept already), evicting the least recently used until it fits.
    pub fn keep(&self, rows: &Rows, prefix: SharedPrefix, backbone: &BackboneState<B>, tower: &TowerState<B>) {
        if !prefix.applies_to(rows) {
            return;
        }
        assert_eq!(backbone.position, prefix.rows, "a prefix kept from a state past or short of it");
        let key = key(rows, prefix);
        let mut inner = self.inner.borrow_mut();
        let inner = &mut *inner;
        inner.clock += 1;
        if let Some(entry) = inner.entries.get_mut(key.as_slice()) {
            entry.last_used = inner.clock;
            return;
        }
        let parts = parts(backbone, tower);
        let bytes = self.backend.saved_footprint(&parts, prefix.rows);
        if bytes > inner.stats.budget {
            inner.stats.too_large += 1;
            return;
        }
        while inner.stats.bytes + bytes > inner.stats.budget && inner.evict_oldest() {}
        // The backend's room can be short of the budget's count only by its own rounding; make
        // more room until it takes the copy or nothing is left to drop.
        let saved = loop {
            if let Some(saved) = self.backend.save_state(&parts, prefix.rows) {
                break saved;
            }
            if !inner.evict_oldest() {
                inner.stats.too_large += 1;
                return;
            }
        };
        inner.entries.insert(key.into_boxed_slice(), Entry { saved, bytes, last_used: inner.clock });
        inner.stats.saved += 1;
        inner.stats.entries = inner.entries.len();
        inner.stats.bytes += bytes;
    }
}

impl<B: Backend> Inner<B> {
    /// Drops the least recently used prefix; `false` when none is left.
    fn evict_oldest(&mut self) -> bool {
        let Some(oldest) = self.entries.iter().min_by_key(|(_, e)| e.last_used).map(|(k, _)| k.clone()) else {
            return false;
        };
        let entry = self.entries.remove(&oldest).expect("the key was just found");
        self.stats.bytes -= entry.bytes;
        self.stats.evicted += 1;
        self.stats.entries = self.entries.len();
        true
    }
}

/// The prefix's rows and the row after them, flat.
fn key(rows: &Rows, prefix: SharedPrefix) -> Vec<u32> {
    rows.as_flat()[..(prefix.rows + 1) * rows.width()].to_vec()
}

/// A state's pieces in save order: the backbone's layers, then the tower's caches.
fn parts<'a, B: Backend>(backbone: &'a BackboneState<B>, tower: &'a TowerState<B>) -> Vec<StatePart<'a, B>> {
    let layers = backbone.layers.iter().map(|layer| match layer {
        LayerState::Gdn(s) => StatePart::Gdn(s),
        LayerState::Attention(c) => StatePart::Kv(c),
    });
    layers.chain(tower.caches().iter().map(StatePart::TowerKv)).collect()
}

/// [`parts`] for writing.
fn parts_mut<'a, B: Backend>(
    backbone: &'a mut BackboneState<B>,
    tower: &'a mut TowerState<B>,
) -> Vec<StatePartMut<'a, B>> {
    let layers = backbone.layers.iter_mut().map(|layer| match layer {
        LayerState::Gdn(s) => StatePartMut::Gdn(s),
        LayerState::Attention(c) => StatePartMut::Kv(c),
    });
    layers.chain(tower.caches_mut().iter_mut().map(StatePartMut::TowerKv)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_stop_at_the_prefix_end_and_restart_there() {
        let p = SharedPrefix { rows: 10, keep: true };
        let mut ends = Vec::new();
        let mut done = 0;
        while done < 30 {
            done = p.chunk_end(done, 30, 8);
            ends.push(done);
        }
        assert_eq!(ends, vec![8, 10, 18, 26, 30]);
        assert_eq!(SharedPrefix::NONE.chunk_end(0, 30, 8), 8);
        assert_eq!(SharedPrefix { rows: 40, keep: true }.chunk_end(24, 30, 8), 30);
    }
}
