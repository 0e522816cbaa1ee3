//! The grouping of a pass's (row, slot) pairs by expert into tiles (`moe_group_pairs`,
//! `moe_route_group`, or the decode tiles' own): its device buffers and the bound on its tiles,
//! which sizes the tile kernels' grids.

use crate::backend::cuda::Cuda;
use crate::backend::cuda::memory::PoolBuf;

/// One pass's (row, slot) pairs sorted by expert, and its tiles of at most `tile_rows` pairs of
/// one expert (`moe_group_pairs`'s outputs).
pub(super) struct Grouping {
    /// `[experts + 1]` i32: each expert's first sorted position.
    pub(super) offsets: PoolBuf,
    /// `[pairs]` i32: the pair `row·top_k + slot` at each sorted position.
    pub(super) sorted: PoolBuf,
    /// `[1 + 2·max_tiles]` i32: the tile count, then (expert, first sorted position) per tile.
    pub(super) tiles: PoolBuf,
    pub(super) tile_rows: usize,
}

impl Grouping {
    pub(super) fn new(cuda: &Cuda, experts: usize, max_pairs: usize, tile_rows: usize) -> Grouping {
        Grouping {
            offsets: cuda.scratch((experts + 1) * 4),
            sorted: cuda.scratch(max_pairs * 4),
            tiles: cuda.scratch((1 + 2 * tile_bound(experts, max_pairs, tile_rows)) * 4),
            tile_rows,
        }
    }

    pub(super) fn max_tiles(&self, experts: usize, pairs: usize) -> usize {
        tile_bound(experts, pairs, self.tile_rows)
    }
}

/// At most this many tiles hold `pairs` pairs: one per whole `tile_rows`, plus one partial tile
/// per expert used; and no more than the pairs (a tile holds one at least). The tile kernels'
/// grids are this wide: one decode row (8 pairs of 8 experts) makes exactly 8 tiles, and the 9th
/// column of blocks the first term alone gave pushed gate/up's 288 blocks past the H100's 264
/// slots (two a SM), a second wave of ~21 working blocks (ncu, run 26: 1.09 waves).
fn tile_bound(experts: usize, pairs: usize, tile_rows: usize) -> usize {
    (pairs.div_ceil(tile_rows) + experts.min(pairs)).min(pairs)
}

#[cfg(test)]
mod tests {
    use super::tile_bound;

    /// The tiles `moe_group_pairs` makes of these experts' pair counts: ⌈count / tile_rows⌉ each.
    fn tiles(counts: &[usize], tile_rows: usize) -> usize {
        counts.iter().map(|c| c.div_ceil(tile_rows)).sum()
    }

    #[test]
    fn tile_bound_holds_every_grouping_and_is_exact_for_one_decode_row() {
        // One decode row: top-8 of 256 experts, a pair each.
        assert_eq!(tile_bound(256, 8, 8), 8);
        assert_eq!(tiles(&[1; 8], 8), 8);
        // Every way to deal `pairs` pairs over a few experts (a row's pairs are distinct experts,
        // but the bound must hold for any ids): counts dealt at random.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..20_000 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let experts = 1 + (seed >> 33) as usize % 64;
            let pairs = 1 + (seed >> 13) as usize % 300;
            let tile_rows = [8, 32][(seed >> 7) as usize % 2];
            let mut counts = vec![0; experts];
            let mut s = seed;
            for _ in 0..pairs {
                s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                counts[(s >> 40) as usize % experts] += 1;
            }
            assert!(tiles(&counts, tile_rows) <= tile_bound(experts, pairs, tile_rows), "{counts:?} by {tile_rows}");
        }
    }
}
