//! The prefill GEMM's launcher (`kernels/linear_gemm.cu`, `Path::Gemm` and `Path::GemmMmaSync`
//! of [`super::project`]): which kernel and tile a launch shape takes, and its grid and shared
//! memory. Two families, each fixing every output's reduction order by `k` alone, so every tile
//! of a family gives a row the same bits: mma.sync (`linear_gemm_r32`, `_r64`, `_r128`) on every
//! GPU, and wgmma (`linear_gemm_wg_64x64`, `_64x128`, `_128x128`) where the GPU is compute
//! capability 9.0, which then takes it for every prefill projection.

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::super::Cuda;
use super::super::kernel_constants::{GEMM_WG_64X64_STAGES, GEMM_WG_64X128_STAGES, GEMM_WG_128X128_STAGES};
use super::super::launch::{Dims, Kernel, KernelError, Module, embedded};

/// Output features per mma.sync block (`gemm::BN` in the .cu); input rows per block of
/// `linear_gemm_r32`, `linear_gemm_r64` and `linear_gemm_r128`; threads of each.
const MMA_SYNC_FEATURES: usize = 128;
const R32_ROWS: usize = 32;
const R64_ROWS: usize = 64;
const R128_ROWS: usize = 128;
const MMA_SYNC_THREADS: u32 = 256;
/// Rows from which both families take 128-row blocks: fewer rows keep more blocks in flight with
/// smaller ones (the same bits either way).
const R128_FROM_ROWS: usize = 512;

/// A tile shape of `linear_gemm_wg_*`: input rows and output features per block (one warpgroup of
/// 128 threads per 64 rows) and its k stages in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WgShape {
    rows: usize,
    features: usize,
    stages: usize,
}

/// The wgmma tiles, in the order of their kernels in [`GemmKernels::wg`].
const WG_SHAPES: [(&str, WgShape); 3] = [
    ("linear_gemm_wg_64x64", WgShape { rows: 64, features: 64, stages: GEMM_WG_64X64_STAGES }),
    ("linear_gemm_wg_64x128", WgShape { rows: 64, features: 128, stages: GEMM_WG_64X128_STAGES }),
    ("linear_gemm_wg_128x128", WgShape { rows: 128, features: 128, stages: GEMM_WG_128X128_STAGES }),
];
const WG_64X64: usize = 0;
const WG_64X128: usize = 1;
const WG_128X128: usize = 2;

impl WgShape {
    fn threads(self) -> u32 {
        u32::try_from(self.rows / 64 * 128).expect("threads")
    }

    /// Its k stages of x and W rows (64 bf16 each), and the 1 KiB it may skip to start the
    /// tiles on 1024 bytes (the swizzle's period).
    fn smem_bytes(self) -> usize {
        self.stages * (self.rows + self.features) * 64 * 2 + 1024
    }
}

/// Dynamic shared memory of `linear_gemm_r*` with `rows_per_block` rows: its stages (4 at 32 and
/// 64 rows, 3 at 128: the `STAGES` each kernel instantiates in the .cu) of the block's x and W
/// rows, 64 bf16 each (`gemm::BK`). 96 KiB at most: within every supported GPU's per-block limit
/// (≥ 99 KiB from sm_80).
fn mma_sync_smem_bytes(rows_per_block: usize) -> usize {
    let stages = if rows_per_block <= R64_ROWS { 4 } else { 3 };
    stages * (rows_per_block + MMA_SYNC_FEATURES) * 64 * 2
}

/// Input rows per `linear_gemm_r*` block for `rows` rows of an `n`-feature projection on `sms`
/// SMs: 128 from [`R128_FROM_ROWS`] rows, else 32 where the 32-row grid still fits one block an
/// SM (each SM then has half the work it would have at 64), else 64. Run 27 (an H100, 200
/// rows): [2048, ·] 41.9 → 33.7 µs and [512, ·] 21.2 → 16.9 µs at 32 rows (112 and 28 blocks),
/// but [4096, ·] 22.5 → 27.0 µs (224 blocks: two on most SMs, each as slow as one of 64 rows).
fn mma_sync_rows_per_block(rows: usize, n: usize, sms: i32) -> usize {
    if rows >= R128_FROM_ROWS {
        return R128_ROWS;
    }
    let blocks = n.div_ceil(MMA_SYNC_FEATURES) * rows.div_ceil(R32_ROWS);
    if blocks <= usize::try_from(sms).unwrap_or(0) { R32_ROWS } else { R64_ROWS }
}

/// The `linear_gemm_wg_*` tile (an index into [`WG_SHAPES`]) for `rows` rows of an `n`-feature
/// projection on `sms` SMs: 128 × 128 from [`R128_FROM_ROWS`] rows; else 64 × 64 while that grid
/// is at most two blocks an SM (both fit at once), else 64 × 128. Run 30's lab (an H100): 64 × 64
/// was the fastest of nine shapes at 85 and 200 rows up to 4096 features, 64 × 128 at 200 × 8192,
/// 128 × 128 at 1000 rows.
fn wg_tile(rows: usize, n: usize, sms: i32) -> usize {
    if rows >= R128_FROM_ROWS {
        return WG_128X128;
    }
    let small = WG_SHAPES[WG_64X64].1;
    let blocks = n.div_ceil(small.features) * rows.div_ceil(small.rows);
    if blocks <= 2 * usize::try_from(sms).unwrap_or(0) { WG_64X64 } else { WG_64X128 }
}

pub(super) struct GemmKernels {
    /// `linear_gemm_r32`, `linear_gemm_r64` and `linear_gemm_r128`: the same arithmetic.
    r32: Kernel,
    r64: Kernel,
    r128: Kernel,
    /// The kernels of [`WG_SHAPES`] on compute capability 9.0; `None` on every other GPU.
    wg: Option<Vec<Kernel>>,
}

impl GemmKernels {
    /// `hopper`: the GPU is compute capability 9.0, whose kernels include sm_90a's wgmma.
    pub(super) fn load(ctx: &Arc<CudaContext>, hopper: bool) -> Result<GemmKernels, KernelError> {
        let m = Module::load_overlapping(ctx, "linear_gemm", embedded::LINEAR_GEMM)?;
        let r = |name, rows_per_block| m.kernel_with_shared(name, mma_sync_smem_bytes(rows_per_block));
        let wg = if hopper {
            let kernels = WG_SHAPES.iter().map(|&(name, shape)| m.kernel_with_shared(name, shape.smem_bytes()));
            Some(kernels.collect::<Result<Vec<_>, _>>()?)
        } else {
            None
        };
        Ok(GemmKernels {
            r32: r("linear_gemm_r32", R32_ROWS)?,
            r64: r("linear_gemm_r64", R64_ROWS)?,
            r128: r("linear_gemm_r128", R128_ROWS)?,
            wg,
        })
    }

    /// Queues `y = x · Wᵀ` for `rows` rows of width `k` (`k % 8 == 0`) and an `[n, k]` weight:
    /// on the wgmma kernels where `wgmma` is asked for and the GPU has them, else on mma.sync.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch(&self, cuda: &Cuda, x: u64, rows: usize, w: u64, y: u64, n: usize, k: usize, wgmma: bool) {
        let args = [x.into(), w.into(), y.into(), rows.into(), n.into(), k.into()];
        let sms = cuda.info().multiprocessors;
        let (kernel, grid, dims) = match (&self.wg, wgmma) {
            (Some(wg), true) => {
                let tile = wg_tile(rows, n, sms);
                let shape = WG_SHAPES[tile].1;
                let grid = (n.div_ceil(shape.features) as u32, rows.div_ceil(shape.rows) as u32, 1);
                (&wg[tile], grid, (shape.threads(), shape.smem_bytes()))
            }
            _ => {
                let per_block = mma_sync_rows_per_block(rows, n, sms);
                let kernel = match per_block {
                    R128_ROWS => &self.r128,
                    R64_ROWS => &self.r64,
                    _ => &self.r32,
                };
                let grid = (n.div_ceil(MMA_SYNC_FEATURES) as u32, rows.div_ceil(per_block) as u32, 1);
                (kernel, grid, (MMA_SYNC_THREADS, mma_sync_smem_bytes(per_block)))
            }
        };
        kernel.launch(cuda.stream(), Dims::grid(grid, dims.0).with_shared(dims.1 as u32), &args);
    }
}

#[cfg(test)]
mod tests {
    use super::{R32_ROWS, R64_ROWS, R128_ROWS, WG_64X64, WG_64X128, WG_128X128, WG_SHAPES};
    use super::{mma_sync_rows_per_block, wg_tile};

    #[test]
    fn the_wgmma_gemm_takes_the_tile_run_30_timed_fastest_for_each_shape() {
        for n in [512, 2048, 4096] {
            assert_eq!(wg_tile(200, n, 132), WG_64X64, "200 × {n}");
            assert_eq!(wg_tile(85, n, 132), WG_64X64, "85 × {n}");
        }
        assert_eq!(wg_tile(200, 8192, 132), WG_64X128);
        assert_eq!(wg_tile(1000, 2048, 132), WG_128X128);
        assert_eq!(wg_tile(1000, 8192, 132), WG_128X128);
    }

    #[test]
    fn every_wgmma_tile_fits_hoppers_shared_memory_and_its_thread_limit() {
        for (name, shape) in WG_SHAPES {
            assert!(shape.smem_bytes() <= 227 << 10, "{name}");
            assert!(shape.threads() <= 1024 && shape.rows.is_multiple_of(64), "{name}");
        }
    }

    #[test]
    fn the_prefill_gemm_halves_its_row_blocks_only_where_each_sm_keeps_one() {
        // A 200-row prompt on 132 SMs: [2048, ·] is 16 × 7 = 112 blocks at 32 rows, so 32;
        // [4096, ·] would be 32 × 7 = 224 and [8192, ·] 448: 64.
        assert_eq!(mma_sync_rows_per_block(200, 2048, 132), R32_ROWS);
        assert_eq!(mma_sync_rows_per_block(200, 4096, 132), R64_ROWS);
        assert_eq!(mma_sync_rows_per_block(200, 8192, 132), R64_ROWS);
        assert_eq!(mma_sync_rows_per_block(300, 4096, 132), R64_ROWS);
        assert_eq!(mma_sync_rows_per_block(512, 512, 132), R128_ROWS);
        assert_eq!(mma_sync_rows_per_block(9, 512, 132), R32_ROWS);
    }
}
