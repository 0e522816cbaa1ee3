//! The router's launches (`kernels/moe_route.cu`): its fp32 logits, one warp per logit or, from
//! a few rows, in register tiles with the same bits; softmax, top-k and renormalisation
//! (`moe_route`, or inside the grouping launch for a decode step's few rows).

use super::{Cuda, GROUP_THREADS, Routing, check_shapes};
use crate::backend::backbone::MoeShape;
use crate::backend::cuda::kernel_constants::{ROUTER_BLOCK_LOGITS, ROUTER_BLOCK_ROWS};
use crate::backend::cuda::launch::Dims;
use crate::backend::cuda::memory::PoolBuf;
use crate::backend::cuda::tensor::{GpuMatrix, GpuWeight};
use crate::model::weights::MoeWeights;

/// From this many rows the router logits run in register tiles (`moe_router_logits_tiled`, the
/// same bits as one warp per logit).
const ROUTER_TILED_MIN_ROWS: usize = ROUTER_BLOCK_ROWS;
const ROUTE_ROWS_PER_BLOCK: usize = 4;
/// Up to this many rows the decode batch routes and groups in one launch (one block: the rows
/// are routed 32 at a time, so many rows would be slower than `moe_route`'s grid).
const ROUTE_GROUP_MAX_ROWS: usize = 64;

/// Router logits in fp32, softmax, top-k, renormalise; and the shared expert's sigmoid gate.
pub fn route(cuda: &Cuda, s: &MoeShape, w: &MoeWeights<GpuWeight>, x: &GpuMatrix) -> Routing {
    let (routing, logits) = router_logits(cuda, s, w, x);
    let (rows, e, k) = (x.rows, s.experts, s.top_k);
    if rows == 0 {
        return routing;
    }
    let args = [
        logits.ptr().into(),
        rows.into(),
        e.into(),
        k.into(),
        routing.ids.ptr().into(),
        routing.weights.ptr().into(),
        routing.shared_gate.ptr().into(),
    ];
    let dims = Dims::linear(rows.div_ceil(ROUTE_ROWS_PER_BLOCK), (ROUTE_ROWS_PER_BLOCK * 32) as u32)
        .with_shared((ROUTE_ROWS_PER_BLOCK * e * 4) as u32);
    cuda.kernels.moe.route.launch(cuda.stream(), dims, &args);
    routing
}

/// The router's logits `[rows, E + 1]` f32 (the last column the shared expert's gate), and the
/// routing buffers that `moe_route` (or `moe_route_group`) fills from them.
pub(super) fn router_logits(cuda: &Cuda, s: &MoeShape, w: &MoeWeights<GpuWeight>, x: &GpuMatrix) -> (Routing, PoolBuf) {
    check_shapes(s, w, x);
    let (rows, h, e, k) = (x.rows, x.cols, s.experts, s.top_k);
    let logits = cuda.scratch(rows * (e + 1) * 4);
    let routing = Routing {
        ids: cuda.scratch(rows * k * 4),
        weights: cuda.scratch(rows * k * 4),
        shared_gate: cuda.scratch(rows * 4),
    };
    if rows > 0 {
        let args = [
            x.ptr().into(),
            w.router.ptr.into(),
            w.shared_expert_gate.ptr.into(),
            logits.ptr().into(),
            e.into(),
            h.into(),
        ];
        if rows >= ROUTER_TILED_MIN_ROWS && h.is_multiple_of(8) {
            let args = [args[0], args[1], args[2], args[3], rows.into(), e.into(), h.into()];
            let dims = Dims::grid(
                ((e + 1).div_ceil(ROUTER_BLOCK_LOGITS) as u32, rows.div_ceil(ROUTER_BLOCK_ROWS) as u32, 1),
                256,
            );
            cuda.kernels.moe.router_logits_tiled.launch(cuda.stream(), dims, &args);
        } else {
            let dims = Dims::grid(((e + 1).div_ceil(8) as u32, rows as u32, 1), 256);
            cuda.kernels.moe.router_logits.launch(cuda.stream(), dims, &args);
        }
    }
    (routing, logits)
}

/// Whether the decode batch routes and groups in one launch (`moe_route_group`): few rows, and
/// the block's 32 warps' softmax rows fit the default shared memory.
pub(super) fn routes_in_group(rows: usize, experts: usize) -> bool {
    rows <= ROUTE_GROUP_MAX_ROWS && experts * 4 * (GROUP_THREADS as usize / 32) <= 48 << 10
}
