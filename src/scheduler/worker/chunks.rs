//! A long request's chunks in the worker (issue 15): when a chunk ends, the stream goes on with
//! the next chunk's prompt; a later chunk that a guard cut (the runaway guard's frame bound, or
//! the stall guard: its audio stood still) is generated once more with another seed
//! ([`retry_seed`]) before anyone hears it.
//!
//! Why a later chunk can be retried unheard: its audio is held undecoded while it runs
//! ([`Synthesizer::continue_stream`] with `hold`), and the client meanwhile plays the chunks
//! before it, which took longer to play than this one takes to make whenever the stream runs
//! faster than real time. The first chunk streams as it is made (first audio must not wait for
//! a whole chunk), so it is cut but never retried.

use std::panic::{AssertUnwindSafe, catch_unwind};

use tracing::{debug, warn};

use super::Host;
use super::active::Active;
use crate::backend::panic_message;
use crate::engine::generate::{FinishReason, GenerateOptions};
use crate::scheduler::Synthesizer;
use crate::scheduler::job::{ChunkPrompt, chunk_seed, holds_chunk, retries_chunk, retry_seed};
use crate::telemetry;

impl Host {
    /// `job`'s running chunk ended with `reason` (not cancelled): settles its held audio (kept:
    /// decoded, or sent to the codec thread, now), then retries it, or goes on to the next
    /// chunk. Returns whether the stream goes on (`false`: the request is done).
    pub(super) fn chunk_ended(
        &self,
        model: &dyn Synthesizer,
        job: &mut Active,
        reason: FinishReason,
    ) -> Result<bool, String> {
        let id = job.stream.expect("a stepped job has a stream");
        if reason == FinishReason::Length && (job.more.is_some() || job.chunk > 0) {
            // A chunk of long text ran to its bound (the runaway guard's, or max_frames).
            metrics::counter!(telemetry::CHUNKS_CUT, "bound" => "frames").increment(1);
            job.span.in_scope(|| warn!(chunk = job.chunk, "chunk cut at its frame bound"));
        }
        if reason == FinishReason::Stalled {
            metrics::counter!(telemetry::CHUNKS_CUT, "bound" => "stall").increment(1);
            job.span.in_scope(|| warn!(chunk = job.chunk, "chunk cut: its audio stood still"));
        }
        let held = std::mem::take(&mut job.holding);
        let guarded = job.chunk_prompt.as_ref().is_some_and(|p| p.guarded);
        let retry = held && retries_chunk(reason, job.chunk, guarded, job.retried);
        if held {
            let settled = engine_call(|| model.settle_chunk(id, !retry).map_err(|e| e.to_string()))?;
            self.take_audio(job, settled);
        }
        if retry {
            self.retry_chunk(model, job)?;
            return Ok(true);
        }
        job.retried = false;
        job.cut |= reason.is_cut();
        self.next_chunk(model, job)
    }

    /// Runs the running chunk's prompt again with its retry seed; its first take's frames were
    /// dropped unheard. The retry streams as it is made (there is no third take).
    fn retry_chunk(&self, model: &dyn Synthesizer, job: &mut Active) -> Result<(), String> {
        let id = job.stream.expect("a stepped job has a stream");
        let prompt = job.chunk_prompt.clone().expect("a later chunk keeps its prompt");
        let dropped = engine_call(|| Ok(model.produced(id).len()))?;
        start_chunk(model, job, prompt, retry_seed(job.options.seed, job.chunk), false)?;
        metrics::counter!(telemetry::FRAMES_GENERATED).increment(dropped as u64);
        metrics::counter!(telemetry::CHUNKS_RETRIED).increment(1);
        job.retried = true;
        job.span.in_scope(|| warn!(chunk = job.chunk, dropped_frames = dropped, "chunk retried with another seed"));
        Ok(())
    }

    /// Takes a long request on to its next chunk once a chunk ended (not cancelled): the chunk's
    /// frames go into the next prompt's history (`MoreChunks`), and the stream goes on with that
    /// prompt, its audio continuing. Returns whether it did (`false`: no chunk is left).
    pub(super) fn next_chunk(&self, model: &dyn Synthesizer, job: &mut Active) -> Result<bool, String> {
        let (Some(more), Some(id)) = (job.more.as_mut(), job.stream) else { return Ok(false) };
        let previous = engine_call(|| Ok(model.produced(id)))?;
        let Some(prompt) = engine_call(|| more.next(&previous).transpose())? else {
            job.more = None;
            return Ok(false);
        };
        // A chunk a guard may cut is held, so that its retry is heard instead.
        let hold = holds_chunk(&prompt, job.options.stall);
        start_chunk(model, job, prompt, chunk_seed(job.options.seed, job.chunk + 1), hold)?;
        metrics::counter!(telemetry::FRAMES_GENERATED).increment(previous.len() as u64);
        job.chunk += 1;
        job.frames_before += previous.len();
        let rows = job.chunk_prompt.as_ref().map_or(0, |p| p.rows.len());
        let restored = rows - job.prompt_left;
        job.span.in_scope(|| debug!(chunk = job.chunk, prompt_rows = rows, restored_rows = restored, "next chunk"));
        Ok(true)
    }
}

/// Opens `prompt` in `job`'s stream with `seed` as its running chunk (`hold`: its audio waits
/// for `chunk_ended`), its prompt rows counted into the request's usage.
fn start_chunk(
    model: &dyn Synthesizer,
    job: &mut Active,
    prompt: ChunkPrompt,
    seed: u64,
    hold: bool,
) -> Result<(), String> {
    let id = job.stream.expect("a stepped job has a stream");
    let options = GenerateOptions { seed, max_frames: prompt.max_frames, ..job.options.clone() };
    let opened = engine_call(|| {
        model.continue_stream(id, &prompt.rows, prompt.prefix, &options, hold).map_err(|e| e.to_string())
    })?;
    job.prompt_rows += prompt.rows.len();
    job.prompt_left = prompt.rows.len() - opened.restored_rows;
    job.prefilled = false;
    job.holding = hold;
    job.chunk_prompt = Some(prompt);
    Ok(())
}

/// Runs `call` on the engine; a panic in it fails this job alone.
fn engine_call<T>(call: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(call))
        .unwrap_or_else(|panic| Err(format!("the engine panicked: {}", panic_message(&*panic))))
}
