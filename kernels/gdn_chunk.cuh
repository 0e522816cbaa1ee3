// The Gated DeltaNet's chunked prefill (`backbone.md` §3.7): `gdn_chunk_intra`
// (gdn_chunk_intra.cu), then `gdn_chunk_scan` (gdn_chunk_scan.cu), the chunked form of flash-linear-attention (github.com/fla-org/flash-linear-
// attention, MIT licence, `chunk_gated_delta_rule`) as the transformers torch reference computes
// it: T = (I + A)⁻¹ by forward substitution, then products. Layouts of `prep` and `gates`: gdn.cu's
// header (its decode core, conv and gated norm are there); the CPU oracle (f64) is
// `src/backend/cpu/backbone/gdn_chunk.rs`.
//
// Precision. The products run on the bf16 tensor cores (mma.sync m16n8k16) with every f32
// operand split as hi = bf16(x), lo = bf16(x − hi) (16 significant bits) and summed as
// lo·hi + hi·lo + hi·hi into f32 accumulators (`mma_split_k16`): a product's error is ~2⁻¹⁶ of
// its terms' magnitudes, where the reference's f32 is ~2⁻²⁴; the core's output is rounded to
// bf16 (2⁻⁹) two kernels later. The substitution, the decays, the state and every sum outside
// the MMAs stay f32. A sequence's bits depend only on its own rows: no reduction crosses a
// sequence, and every order is fixed by the shapes alone.
// Why (issue 14, run 37 on an H100): the f32 CUDA-core kernels these replace took 61 and 63 µs
// a launch at a 200-row prompt, latency-bound (substitution chains, shared-memory round trips)
// at 1 and 2.2 IPC against a few µs of work.
//
// Scratch written by the first and read by the second, row t of the call (t = the chunk's first
// row + i), value head j, key head h; Dkp = Dk rounded up to 16 (columns past Dk are zeros):
//   qk     bf16 [rows, Hk, 4, GDN_MAX_DK]    q hi, q lo, k hi, k lo (columns [0, Dkp) written)
//   w      bf16 [rows, Hv, 2, GDN_MAX_DK]    W hi, lo (columns [0, Dkp))
//   u      f32  [rows, Hv, Dv]               U
//   c      bf16 [rows, Hv, 2, 64]            row i of the chunk's C, hi and lo (zeros past i)
//   decay  f32  [rows, Hv, 2]                e^{γ_i}, e^{γ_{n−1}−γ_i}
// with γ the cumulative log-decay from the chunk start and
//   A = strict lower β_i (k_i·k_m) e^{γ_i−γ_m};  T = (I + A)⁻¹;
//   U = T diag(β) V;  W = T diag(β e^γ) K;  C = lower (q_i·k_m) e^{γ_i−γ_m} (diagonal included).
// These depend on no state, so `gdn_chunk_intra` computes them for every chunk of every prompt
// at once; `gdn_chunk_scan` then walks each prompt's chunks in order:
//   V_new = U − W S;  O = e^γ ⊙ (Q S) + C V_new;  S ← e^{γ_n} S + Kᵀ (e^{γ_n−γ} ⊙ V_new).
#pragma once
#include "common.cuh"
// GDN_THREADS, GDN_CHUNK, GDN_SCAN_BV, GDN_MAX_DK, GDN_SQ_STRIDE, GDN_TILE_STRIDE,
// GDN_SQUARE_STRIDE, GDN_SQUARE_FLOATS: src/backend/cuda/kernel_constants.rs.
#include "kernel_constants.cuh"
#include "mma.cuh"

// The rows [t_begin, t_end) of sequence z: the whole call without `seq_starts`.
__device__ __forceinline__ void gdn_sequence_rows(const int* seq_starts, int rows, int z, int& t_begin, int& t_end) {
    t_begin = seq_starts ? seq_starts[z] : 0;
    t_end = seq_starts ? seq_starts[z + 1] : rows;
}
