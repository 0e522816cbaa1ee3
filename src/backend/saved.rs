//! Saved request state: a copy of one request's backbone and tower state after its first rows,
//! held apart from any request, and written back into another request's state later. The engine
//! keeps the state after a voice's prompt prefix this way (`engine::prefix`), so a request in
//! that voice prefills only its own rows.
//!
//! A save is a plain copy: restoring it gives the target the very bits the source had, so a
//! request that starts from a restored prefix computes exactly what a full prefill would.

use super::backbone::BackboneOps;
use super::tower::TowerOps;

/// One piece of a request's state, read by a save.
pub enum StatePart<'a, B: BackboneOps + TowerOps + ?Sized> {
    /// A GDN layer's conv and recurrent state (fixed size).
    Gdn(&'a B::GdnState),
    /// A backbone attention layer's KV cache (its first `rows` positions are saved).
    Kv(&'a B::KvCache),
    /// A tower layer's KV cache (its first `rows` positions are saved).
    TowerKv(&'a B::TowerKv),
}

/// One piece of a request's state, written by a restore.
pub enum StatePartMut<'a, B: BackboneOps + TowerOps + ?Sized> {
    Gdn(&'a mut B::GdnState),
    Kv(&'a mut B::KvCache),
    TowerKv(&'a mut B::TowerKv),
}

/// Saving and restoring request state.
pub trait SavedStateOps: BackboneOps + TowerOps {
    /// A saved copy: the CPU's host vectors, or pages of the GPU's saved-state arena.
    type Saved;

    /// Bytes a save of `parts` (KV caches cut to their first `rows` positions) takes from the
    /// backend's room for saved state, including what the backend rounds up to.
    fn saved_footprint(&self, parts: &[StatePart<'_, Self>], rows: usize) -> usize;

    /// Room for saved state in bytes, if the backend bounds it itself (the GPU's arena, sized
    /// at start-up); `None`: only the caller's budget bounds it (host memory).
    fn saved_capacity(&self) -> Option<usize>;

    /// A copy of `parts`, KV caches cut to their first `rows` positions (each holds at least
    /// that many). `None` when the backend's room for saved state cannot take it now (the
    /// caller evicts and retries). The copy is ordered before any later work on the state.
    fn save_state(&self, parts: &[StatePart<'_, Self>], rows: usize) -> Option<Self::Saved>;

    /// Writes `saved` into `parts`: the same kinds and shapes, in the order they were saved.
    /// Each KV cache then holds exactly the saved positions.
    ///
    /// # Panics
    /// If `parts` do not match the save.
    fn restore_state(&self, saved: &Self::Saved, parts: &mut [StatePartMut<'_, Self>]);
}
