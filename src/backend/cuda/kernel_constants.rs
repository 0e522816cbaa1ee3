//! Constants that the kernels and their Rust launchers both depend on, defined once, here.
//! `build.rs` reads this file and writes each constant as a `#define` into
//! `$OUT_DIR/kernel_constants.cuh`, which the kernel files include; the launchers use them
//! from this module. So a block size or a shared-memory layout cannot drift between the two.
//!
//! Every constant is `pub const NAME: usize = EXPRESSION;` on one line, the expression made of
//! integer literals, earlier names, `+ - * /` and parentheses (the same arithmetic in both
//! languages); `build.rs` refuses anything else.

// `linear_mma_r8*` (kernels/linear.cu): the weight pieces a block holds at once, each 16
// feature rows of `PIECE_STEPS` k32 steps, each row `PIECE_STRIDE` 16-byte vectors (padded to
// ≡ 4 mod 8 for conflict-free fragment reads); `PIECE_STAGES − 1` of them in flight.
pub const PIECE_STAGES: usize = 4;
pub const PIECE_STEPS: usize = 32;
pub const PIECE_STRIDE: usize = PIECE_STEPS * 4 + 4;
/// Weights one `linear_mma_*_many` launch takes.
pub const MMA_MANY: usize = 4;

// The k stages in shared memory of the prefill GEMM's wgmma tiles (kernels/linear_gemm.cu,
// `linear_gemm_wg_64x64`, `_64x128`, `_128x128`): 64 bf16 of the block's x and W rows each.
pub const GEMM_WG_64X64_STAGES: usize = 6;
pub const GEMM_WG_64X128_STAGES: usize = 4;
pub const GEMM_WG_128X128_STAGES: usize = 4;

// kernels/norm.cuh: threads of a norm block (one row), and the columns each thread keeps in
// registers, so rows up to NORM_THREADS · NORM_REGS columns (every backbone row) are read in one
// go; `moe_combine_add_norm` (kernels/moe.cu) ends the decode MoE in the next norm for such rows,
// loading the y values of COMBINE_SLOTS slots at a time.
pub const NORM_THREADS: usize = 256;
pub const NORM_REGS: usize = 8;
pub const COMBINE_SLOTS: usize = 8;

/// Pairs of one expert per tile of the decode batch's experts (kernels/moe_rows.cu): one n8
/// MMA column set.
pub const ROWS_PAIRS: usize = 8;
// kernels/moe_route.cu `moe_router_logits_tiled`: the rows and logits of a warp's register tile, and a
// block's 2 × 4 warps' rows and logits.
pub const ROUTER_TILE: usize = 4;
pub const ROUTER_BLOCK_ROWS: usize = 2 * ROUTER_TILE;
pub const ROUTER_BLOCK_LOGITS: usize = 4 * ROUTER_TILE;
// kernels/moe_rows_wide.cu (long prompts' experts): pairs per tile (four n8 column sets a
// warp), output features per block (8 warps × 16), the K groups in shared memory at once.
pub const ROWS_WIDE_PAIRS: usize = 32;
pub const ROWS_WIDE_FEATURES: usize = 128;
pub const ROWS_WIDE_GATE_UP_STAGES: usize = 4;
pub const ROWS_WIDE_DOWN_STAGES: usize = 3;

// kernels/attention.cu: threads of the decode kernel, keys per shared-memory tile, the most q
// heads (of one kv head) a decode CTA takes. kernels/attention_prefill.cu: threads of the prefill
// kernel (four warps of 16 query rows), query rows per CTA, keys per tile.
pub const ATTN_THREADS: usize = 256;
pub const ATTN_TILE_KEYS: usize = 32;
pub const ATTN_CTA_HEADS: usize = 2;
/// The most splits of the keys a decode row's attention takes (flash-decoding): the merge of the
/// splits holds one partial of each in registers.
pub const ATTN_MAX_SPLITS: usize = 64;
pub const ATTN_PREFILL_THREADS: usize = 128;
pub const ATTN_PREFILL_ROWS: usize = 64;
pub const ATTN_PREFILL_KEYS: usize = 64;

// kernels/gdn.cu, gdn_chunk.cuh, gdn_chunk_intra.cu and gdn_chunk_scan.cu: threads of every kernel, tokens per chunk of the prefill (the
// reference's), value columns per CTA of the recurrent core and of the chunk scan, the largest
// key (and, in the chunked prefill, value) dim the cores hold.
pub const GDN_THREADS: usize = 256;
pub const GDN_CHUNK: usize = 64;
pub const GDN_BV: usize = 32;
pub const GDN_SCAN_BV: usize = 16;
pub const GDN_MAX_DK: usize = 128;
/// Row stride (floats) of `gdn_chunk_intra`'s f32 64 × 64 matrix A: float4 rows, padded by 4.
pub const GDN_SQ_STRIDE: usize = GDN_CHUNK + 4;
/// Row strides (bf16) of `gdn_chunk_intra`'s hi/lo tiles of 64 × Dk (or Dv) and of 64 × 64: an
/// odd number of 16-byte units, so an ldmatrix's eight rows fall in distinct bank groups.
pub const GDN_TILE_STRIDE: usize = GDN_MAX_DK + 8;
pub const GDN_SQUARE_STRIDE: usize = GDN_CHUNK + 8;
/// Floats of `gdn_chunk_intra`'s shared region that holds A (f32), then T hi and lo (bf16).
pub const GDN_SQUARE_FLOATS: usize = GDN_CHUNK * GDN_SQUARE_STRIDE;

// kernels/sampling.cu and its draw.cuh: threads of one draw's block, ranks per thread at the
// largest sort, the most logits one draw sorts, and the words of a frame row (`[main, c0, c1..]`:
// at most 14 heads).
pub const SAMPLING_THREADS: usize = 1024;
pub const SAMPLING_ITEMS: usize = 8;
pub const SORT_CAP: usize = SAMPLING_THREADS * SAMPLING_ITEMS;
pub const ROW_CAPACITY: usize = 16;
