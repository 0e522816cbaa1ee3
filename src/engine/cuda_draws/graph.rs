//! The decode batch's step captured as a CUDA graph for the streams stepping now, and replayed
//! while the same streams step in the same rows.
//!
//! Launched one by one, a step's few hundred launches cost the host time the GPU does not fully
//! hide (on an H100 at B = 1: 4.55 ms a step, 4.14 replayed; `docs/perf/2026-12-06-step-graphs.md`).
//! A replay is one launch. What a replay must find in place:
//! - every address the recorded launches read: the streams' states and hidden rows (their own
//!   buffers for the stream's life), the staged inputs and the pool buffers the graph holds;
//! - the per-call tables (row → state addresses and positions) in the graph's [`TableArena`],
//!   uploaded before each replay with every position one row further on;
//! - the host's lengths (positions, cache lengths) moved on as the recorded step moved them.
//!
//! So a graph is only ever replayed for the list of streams it was captured with, and only while
//! nothing but its own replays touched them: any step run launch by launch drops it (such a step
//! gives each stream a new hidden row buffer). A list is captured on its second step in a row,
//! the first having run the same launches eagerly (which builds every lazily made table and
//! leaves the pool holding buffers of the step's sizes). Steps where a row ends its stream's
//! `max_frames` leave it out of the decode, a different list of launches: they run eagerly.
//!
//! The replay runs the same kernels on the same data as the eager step, so a stream's bytes are
//! the same either way (the GPU checks compare them).

use std::panic::AssertUnwindSafe;

use super::{CudaDraws, GraphStats, Stream};
use crate::backend::cuda::Cuda;
use crate::backend::cuda::graph::CapturedGraph;
use crate::backend::cuda::memory::MemoryError;
use crate::backend::cuda::tables::TableArena;
use crate::backend::{OutOfDeviceMemory, panic_message};
use crate::engine::generate::{Engine, GenerateError};
use crate::model::backbone::LayerState;

/// Bytes of tables one row of the step stages per layer, with room to spare: an address pair
/// and a position (a few words of alignment per table counted separately).
const TABLE_BYTES_PER_ROW_LAYER: usize = 32;
const TABLE_ALIGN_BYTES_PER_LAYER: usize = 32;

/// The graph of the streams stepping now, if any.
pub(super) struct StepGraphs {
    /// The streams (ids, in row order) of the last step run launch by launch.
    eager: Option<Vec<u64>>,
    current: Option<Captured>,
    /// The arena between captures (inside `current` while one lives).
    spare: Option<TableArena>,
    arena_bytes: usize,
    /// A capture failed: every later step runs launch by launch (the log says why).
    failed: bool,
    stats: GraphStats,
}

/// One captured step and what its replays read.
struct Captured {
    streams: Vec<u64>,
    graph: CapturedGraph,
    tables: TableArena,
}

impl StepGraphs {
    /// Room for the tables of `rows` rows through `layers` layers (backbone and tower).
    pub(super) fn new(cuda: &Cuda, layers: usize, rows: usize) -> Result<StepGraphs, MemoryError> {
        let bytes = layers * (rows * TABLE_BYTES_PER_ROW_LAYER + TABLE_ALIGN_BYTES_PER_LAYER);
        let arena = TableArena::new(cuda.budget(), bytes)?;
        Ok(StepGraphs {
            eager: None,
            current: None,
            spare: Some(arena),
            arena_bytes: bytes,
            failed: false,
            stats: GraphStats::default(),
        })
    }

    pub(super) fn stats(&self) -> GraphStats {
        self.stats
    }

    /// Runs the step of `streams` (inputs staged, every row going on) as a graph if it can:
    /// replays the one captured for these streams, or captures one if the last step ran these
    /// streams eagerly. Returns whether it ran; `false` leaves everything as it was.
    pub(super) fn step(
        &mut self,
        draws: &CudaDraws<'_>,
        engine: &Engine<'_, Cuda>,
        streams: &mut [&mut Stream<Cuda>],
    ) -> Result<bool, GenerateError> {
        let cuda = draws.cuda;
        let ids: Vec<u64> = streams.iter().map(|s| s.id()).collect();
        if let Some(current) = self.current.as_mut().filter(|c| c.streams == ids) {
            assert!(streams.iter().all(|s| room_for_a_row(s)), "a replayed step past a cache's capacity");
            current.tables.advance_positions();
            current.tables.upload(cuda);
            replay(&current.graph)?;
            for s in streams.iter_mut() {
                let moved: Vec<usize> = lengths(s).iter().map(|len| len + 1).collect();
                set_lengths(s, &moved);
            }
            self.stats.replays += 1;
            return Ok(true);
        }
        self.drop_current(cuda);
        if self.failed || self.eager.as_ref() != Some(&ids) {
            return Ok(false);
        }
        self.capture(draws, engine, streams, ids)
    }

    /// Records the step of `streams` (the list `ids`) as a graph and replays it once; `false`
    /// when it could not be captured (nothing ran; the lengths are put back, and every later
    /// step runs launch by launch).
    fn capture(
        &mut self,
        draws: &CudaDraws<'_>,
        engine: &Engine<'_, Cuda>,
        streams: &mut [&mut Stream<Cuda>],
        ids: Vec<u64>,
    ) -> Result<bool, GenerateError> {
        let cuda = draws.cuda;
        let arena = match self.spare.take() {
            Some(arena) => arena,
            // A panic inside the last capture dropped it.
            None => {
                TableArena::new(cuda.budget(), self.arena_bytes).map_err(|e| GenerateError::Batch(e.to_string()))?
            }
        };
        let before: Vec<Vec<usize>> = streams.iter().map(|s| lengths(s)).collect();
        let every_row = vec![Some(0); ids.len()];
        let mut recorded = None;
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            cuda.record_tables(arena, || {
                CapturedGraph::capture(cuda, || {
                    recorded = Some(draws.record(engine, streams, &every_row, &mut |_| {}).map(|out| {
                        // Each stream's next hidden row, in place: the next replay reads it there.
                        let out = out.expect("every row goes on");
                        for (row, s) in streams.iter().enumerate() {
                            let own = s.hidden.as_ref().expect("a stepping stream has its hidden row");
                            cuda.copy_device_to_device(own.ptr(), out.row_ptr(row), own.bytes());
                        }
                    }));
                })
            })
        }));
        // The recording moved the host's lengths; a replay must move them the same way.
        let one_row_on = (streams.iter().zip(&before))
            .all(|(s, before)| lengths(s).iter().zip(before).all(|(after, before)| *after == before + 1));
        let why = match (outcome, recorded) {
            (Ok((Ok(graph), tables)), Some(Ok(()))) if one_row_on => {
                tables.upload(cuda);
                replay(&graph)?;
                self.stats.captures += 1;
                self.stats.replays += 1;
                self.current = Some(Captured { streams: ids, graph, tables });
                return Ok(true);
            }
            (Err(panic), _) => {
                // Out of device memory is the request's (a 503), not the graph's.
                if panic.is::<OutOfDeviceMemory>() {
                    for (s, before) in streams.iter_mut().zip(&before) {
                        set_lengths(s, before);
                    }
                    std::panic::resume_unwind(panic);
                }
                panic_message(&*panic)
            }
            (Ok((captured, tables)), recorded) => {
                if let Ok(graph) = captured {
                    graph.release(cuda);
                }
                self.spare = Some(tables);
                match recorded {
                    Some(Err(e)) => e.to_string(),
                    _ if !one_row_on => "the recorded step moved a length by other than one row".to_owned(),
                    _ => "the capture failed".to_owned(),
                }
            }
        };
        // Nothing ran: put the lengths back and let the step run eagerly.
        for (s, before) in streams.iter_mut().zip(&before) {
            set_lengths(s, before);
        }
        self.failed = true;
        tracing::error!(reason = %why, "the batch step could not be captured; every step runs launch by launch");
        Ok(false)
    }

    /// The step of `streams` ran launch by launch: any graph is stale (the streams' hidden rows
    /// moved to new buffers); the next step of the same streams is captured.
    pub(super) fn ran_eagerly(&mut self, cuda: &Cuda, streams: &[&mut Stream<Cuda>]) {
        self.drop_current(cuda);
        self.eager = Some(streams.iter().map(|s| s.id()).collect());
    }

    fn drop_current(&mut self, cuda: &Cuda) {
        if let Some(Captured { graph, tables, .. }) = self.current.take() {
            graph.release(cuda);
            self.spare = Some(tables);
        }
    }
}

/// Queues one replay of a captured step.
fn replay(graph: &CapturedGraph) -> Result<(), GenerateError> {
    graph.replay().map_err(|e| GenerateError::Batch(format!("replaying the batch step: {e}")))
}

/// Every host length a decode step moves: the backbone's position and its attention caches'
/// lengths, the tower's position and its caches' lengths.
fn lengths(s: &Stream<Cuda>) -> Vec<usize> {
    let mut out = vec![s.backbone.position];
    out.extend(s.backbone.layers.iter().filter_map(|layer| match layer {
        LayerState::Attention(cache) => Some(cache.len),
        LayerState::Gdn(_) => None,
    }));
    out.push(s.tower.len());
    out.extend(s.tower.caches().iter().map(|kv| kv.cache.len));
    out
}

/// Sets what [`lengths`] reads.
fn set_lengths(s: &mut Stream<Cuda>, lengths: &[usize]) {
    let mut values = lengths.iter().copied();
    let mut next = || values.next().expect("one value per length");
    s.backbone.position = next();
    for layer in &mut s.backbone.layers {
        if let LayerState::Attention(cache) = layer {
            cache.len = next();
        }
    }
    // The tower's count of written positions (`restored` sets it outright).
    s.tower.restored(next());
    for kv in s.tower.caches_mut() {
        kv.cache.len = next();
    }
}

/// Whether every cache of the stream has room for the row a step writes.
fn room_for_a_row(s: &Stream<Cuda>) -> bool {
    let backbone = s.backbone.layers.iter().all(|layer| match layer {
        LayerState::Attention(cache) => cache.len < cache.capacity,
        LayerState::Gdn(_) => true,
    });
    backbone && s.tower.caches().iter().all(|kv| kv.cache.len < kv.cache.capacity)
}
