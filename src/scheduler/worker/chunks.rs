//! A long request's chunks in the worker (issue 15): when a chunk ends, the stream goes on with
//! the next chunk's prompt; a later chunk that the runaway guard cut is generated once more
//! with another seed ([`retry_seed`]) before anyone hears it.
//!
//! Why a later chunk can be retried unheard: its audio is held undecoded while it runs
//! ([`Synthesizer::continue_stream`] with `hold`), and the client meanwhile plays the chunks
//! before it, which took longer to play than this one takes to make whenever the stream runs
//! faster than real time. The first chunk streams as it is made (first audio must not wait for
//! a whole chunk), so it is cut but never retried.

use std::panic::{AssertUnwindSafe, catch_unwind};

use tracing::{debug, warn};

use super::active::Active;
use super::{Host, panic_message};
use crate::engine::generate::{FinishReason, GenerateOptions};
use crate::scheduler::Synthesizer;
use crate::scheduler::job::{chunk_seed, retries_chunk, retry_seed};
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
            metrics::counter!(telemetry::CHUNKS_CUT).increment(1);
            job.span.in_scope(|| warn!(chunk = job.chunk, "chunk cut at its frame bound"));
        }
        let held = std::mem::take(&mut job.holding);
        let retry = retries_chunk(reason, job.chunk, held, job.retried);
        if held {
            let settled = catch_unwind(AssertUnwindSafe(|| model.settle_chunk(id, !retry)))
                .map_err(|panic| format!("the engine panicked: {}", panic_message(&*panic)))?
                .map_err(|e| e.to_string())?;
            self.take_audio(job, settled);
        }
        if retry {
            self.retry_chunk(model, job)?;
            return Ok(true);
        }
        job.retried = false;
        job.cut |= reason == FinishReason::Length;
        self.next_chunk(model, job)
    }

    /// Runs the running chunk's prompt again with its retry seed; its first take's frames were
    /// dropped unheard. The retry streams as it is made (there is no third take).
    fn retry_chunk(&self, model: &dyn Synthesizer, job: &mut Active) -> Result<(), String> {
        let id = job.stream.expect("a stepped job has a stream");
        let prompt = job.chunk_prompt.clone().expect("a later chunk keeps its prompt");
        let options = GenerateOptions {
            seed: retry_seed(job.options.seed, job.chunk),
            max_frames: prompt.max_frames,
            ..job.options.clone()
        };
        let retried = catch_unwind(AssertUnwindSafe(|| {
            let dropped = model.produced(id).len();
            let opened = model.continue_stream(id, &prompt.rows, prompt.prefix, &options, false)?;
            Ok::<_, crate::scheduler::SynthError>((dropped, opened.restored_rows))
        }));
        let (dropped, restored) = match retried {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(panic) => return Err(format!("the engine panicked: {}", panic_message(&*panic))),
        };
        metrics::counter!(telemetry::FRAMES_GENERATED).increment(dropped as u64);
        metrics::counter!(telemetry::CHUNKS_RETRIED).increment(1);
        job.retried = true;
        job.prompt_rows += prompt.rows.len();
        job.prompt_left = prompt.rows.len() - restored;
        job.prefilled = false;
        job.span.in_scope(|| warn!(chunk = job.chunk, dropped_frames = dropped, "chunk retried with another seed"));
        Ok(())
    }

    /// Takes a long request on to its next chunk once a chunk ended (not cancelled): the chunk's
    /// frames go into the next prompt's history (`MoreChunks`), and the stream goes on with that
    /// prompt, its audio continuing. Returns whether it did (`false`: no chunk is left).
    pub(super) fn next_chunk(&self, model: &dyn Synthesizer, job: &mut Active) -> Result<bool, String> {
        let (Some(more), Some(id)) = (job.more.as_mut(), job.stream) else { return Ok(false) };
        let seed = chunk_seed(job.options.seed, job.chunk + 1);
        let went_on = catch_unwind(AssertUnwindSafe(|| {
            let previous = model.produced(id);
            let Some(prompt) = more.next(&previous) else { return Ok(None) };
            let prompt = prompt?;
            let options = GenerateOptions { seed, max_frames: prompt.max_frames, ..job.options.clone() };
            // A chunk the guard may cut is held, so that its retry is heard instead.
            let opened = model
                .continue_stream(id, &prompt.rows, prompt.prefix, &options, prompt.guarded)
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(Some((previous.len(), prompt.rows.len(), opened.restored_rows, prompt)))
        }));
        let (frames, rows, restored, prompt) = match went_on {
            Ok(Ok(Some(next))) => next,
            Ok(Ok(None)) => {
                job.more = None;
                return Ok(false);
            }
            Ok(Err(message)) => return Err(message),
            Err(panic) => return Err(format!("the engine panicked: {}", panic_message(&*panic))),
        };
        metrics::counter!(telemetry::FRAMES_GENERATED).increment(frames as u64);
        job.chunk += 1;
        job.frames_before += frames;
        job.prompt_rows += rows;
        job.prompt_left = rows - restored;
        job.prefilled = false;
        job.holding = prompt.guarded;
        job.chunk_prompt = Some(prompt);
        job.span.in_scope(|| debug!(chunk = job.chunk, prompt_rows = rows, restored_rows = restored, "next chunk"));
        Ok(true)
    }
}
