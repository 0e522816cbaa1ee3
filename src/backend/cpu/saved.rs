//! Saved request state on the CPU: host copies of the state types, KV caches cut to the saved
//! rows.

use super::Cpu;
use super::backbone::{GdnState, KvCache};
use super::tower::CpuTowerKv;
use crate::backend::saved::{SavedStateOps, StatePart, StatePartMut};

/// One saved piece, in the order of the save.
#[derive(Clone, Debug, PartialEq)]
pub enum CpuSavedPart {
    Gdn(GdnState),
    Kv(KvCache),
    TowerKv(CpuTowerKv),
}

/// A saved copy of request state on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuSaved {
    parts: Vec<CpuSavedPart>,
}

/// `cache`'s first `rows` positions.
fn kv_prefix(cache: &KvCache, rows: usize) -> KvCache {
    assert!(rows <= cache.len, "a save of {rows} positions from a KV cache of {}", cache.len);
    let per_row = kv_row_floats(cache);
    KvCache { len: rows, keys: cache.keys[..rows * per_row].to_vec(), values: cache.values[..rows * per_row].to_vec() }
}

/// Floats of one position's keys (0 for an empty cache, which has no shape to say).
fn kv_row_floats(cache: &KvCache) -> usize {
    cache.keys.len().checked_div(cache.len).unwrap_or(0)
}

/// `kv`'s first `rows` positions.
fn tower_kv_prefix(kv: &CpuTowerKv, rows: usize) -> CpuTowerKv {
    assert!(rows <= kv.len(), "a save of {rows} positions from a tower cache of {}", kv.len());
    let n = rows * kv.width;
    CpuTowerKv { width: kv.width, k: kv.k[..n].to_vec(), v: kv.v[..n].to_vec() }
}

fn part_bytes(part: &StatePart<'_, Cpu>, rows: usize) -> usize {
    let floats = match part {
        StatePart::Gdn(s) => s.conv.data.len() + s.recurrent.len(),
        StatePart::Kv(c) => 2 * rows * kv_row_floats(c),
        StatePart::TowerKv(kv) => 2 * rows * kv.width,
    };
    floats * size_of::<f32>()
}

impl SavedStateOps for Cpu {
    type Saved = CpuSaved;

    fn saved_footprint(&self, parts: &[StatePart<'_, Cpu>], rows: usize) -> usize {
        parts.iter().map(|p| part_bytes(p, rows)).sum()
    }

    fn saved_capacity(&self) -> Option<usize> {
        None
    }

    fn save_state(&self, parts: &[StatePart<'_, Cpu>], rows: usize) -> Option<CpuSaved> {
        let parts = parts
            .iter()
            .map(|part| match part {
                StatePart::Gdn(s) => CpuSavedPart::Gdn((*s).clone()),
                StatePart::Kv(c) => CpuSavedPart::Kv(kv_prefix(c, rows)),
                StatePart::TowerKv(kv) => CpuSavedPart::TowerKv(tower_kv_prefix(kv, rows)),
            })
            .collect();
        Some(CpuSaved { parts })
    }

    fn restore_state(&self, saved: &CpuSaved, parts: &mut [StatePartMut<'_, Cpu>]) {
        assert_eq!(saved.parts.len(), parts.len(), "a restore into state of another model");
        for (from, to) in saved.parts.iter().zip(parts.iter_mut()) {
            match (from, to) {
                (CpuSavedPart::Gdn(from), StatePartMut::Gdn(to)) => {
                    assert_eq!(from.recurrent.len(), to.recurrent.len(), "GDN state of another shape");
                    (*to).clone_from(from);
                }
                (CpuSavedPart::Kv(from), StatePartMut::Kv(to)) => (*to).clone_from(from),
                (CpuSavedPart::TowerKv(from), StatePartMut::TowerKv(to)) => {
                    assert_eq!(from.width, to.width, "tower cache of another shape");
                    (*to).clone_from(from);
                }
                _ => panic!("a restore into state of another layer order"),
            }
        }
    }
}
