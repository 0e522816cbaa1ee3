//! Voices warmed, on upload and (the most recent stored ones) once the server is ready: a
//! voice's prompt prefix (the system message holding its reference) runs on the worker once
//! and its state is kept (`engine::prefix`), so that the voice's first
//! request starts from that state as every later one does, and its first audio waits on the
//! request's own rows only. Measured on an H100 (run 17, `tools/gpu/first-audio.sh`): a 5 s
//! reference's first request took 52 ms to first audio (183 prefix rows, then its own 30, two
//! passes over the experts) against 27 ms once kept.
//!
//! The upload does not wait for it: with every slot of the decode batch taken, the warming job
//! queues like a request, and an upload must not hang on other people's audio. A request in the
//! voice that arrives first is admitted after the warming job and usually finds the state kept.
//! Best effort: a server that is busy, draining or keeps no prefixes skips it, and the first
//! request runs the prefix itself, as before. The bytes are the same either way: a prompt's
//! chunks end at its prefix whether or not the state is kept.

use std::time::Instant;

use tracing::{debug, info, warn};

use super::AppState;
use crate::engine::generate::{FinishReason, GenerateOptions};
use crate::model::sampling::SamplingParams;
use crate::request::prompt::{PromptBuilder, Reference};
use crate::request::text::{CallerText, Field};
use crate::scheduler::{Job, JobEvent, JobStream};
use crate::voice::store::Voice;

/// Text for the warming prompt: only its rows after the prefix differ from a real request's,
/// and none of them runs.
const PLACEHOLDER_TEXT: &str = ".";

/// Stored voices warmed when the server starts, the most recently created: about what the
/// default voice cache holds (2 GiB: 26 voices with 10 s references), so that those warmed last
/// do not push out those warmed first.
pub const WARM_AT_START: usize = 24;

/// Queues `voice`'s prompt prefix on the worker, its state to be kept; a task follows the job
/// to its end and logs it (an upload answers without waiting).
pub fn warm(state: &AppState, request_id: &str, voice: &Voice) {
    let started = Instant::now();
    if let Some(stream) = start(state, request_id, voice) {
        let (request_id, name) = (request_id.to_owned(), voice.name.clone());
        tokio::spawn(async move { follow(stream, &request_id, &name, started).await });
    }
}

/// Warms up to `most` stored voices, the most recently created, one after another (oldest of
/// them first, so the newest are the most recently kept); returns how many were kept. The
/// server calls it once it is ready: after a restart, voices in use answer as quickly as
/// before it.
pub async fn warm_stored(state: &AppState, most: usize) -> usize {
    let mut voices = state.voices().list();
    voices.sort_by_key(|v| std::cmp::Reverse(v.created_at));
    voices.truncate(most);
    let mut kept = 0;
    for voice in voices.iter().rev() {
        let started = Instant::now();
        let Some(stream) = start(state, "startup", voice) else { break };
        if !follow(stream, "startup", &voice.name, started).await {
            break; // the engine keeps no voice state, or it failed: the rest would do the same
        }
        kept += 1;
    }
    if kept > 0 {
        info!(voices = kept, "stored voices warmed");
    }
    kept
}

/// Queues the job that runs `voice`'s prompt prefix; `None` when it cannot run (logged).
fn start(state: &AppState, request_id: &str, voice: &Voice) -> Option<JobStream> {
    let Ok(vocabulary) = state.scheduler().vocabulary() else { return None };
    // The references a request in this voice gets (`voices::references`).
    let references = [Reference::from_frames(voice.ref_text.clone(), &voice.codes, voice.codebooks)];
    let prompt = CallerText::check(PLACEHOLDER_TEXT.to_owned(), Field::Input)
        .map_err(|e| e.to_string())
        .and_then(|text| PromptBuilder::new(vocabulary).build_prompt(&text, &references).map_err(|e| e.to_string()));
    let prompt = match prompt {
        Ok(prompt) => prompt,
        Err(e) => {
            warn!(request_id, voice = %voice.name, error = %e, "the voice's prompt could not be built to warm it");
            return None;
        }
    };
    let prefix = prompt.voice_prefix(true);
    // The prefix and the row after it: the kept state's key holds that row too.
    let rows = prompt.rows.slice(0..prefix.rows + 1);
    let span = tracing::info_span!("voice_warm", request_id = %request_id, voice = %voice.name);
    // No frame is drawn: the options only have to be valid.
    let options = GenerateOptions { params: SamplingParams::default(), seed: 0, max_frames: 1, stall: None };
    let job = Job { request_id: request_id.to_owned(), rows, prefix, options, span, more: None };
    match state.scheduler().warm(job) {
        Ok(stream) => Some(stream),
        Err(e) => {
            debug!(request_id, voice = %voice.name, reason = %e, "voice not warmed; its first request runs its prefix");
            None
        }
    }
}

/// Reads a warming job's events to its end (holding the stream: dropping it would cancel the
/// job) and logs it. Returns whether the prefix is kept (0 prompt rows: it was already).
async fn follow(mut stream: JobStream, request_id: &str, name: &str, started: Instant) -> bool {
    while let Some(event) = stream.next().await {
        match event {
            JobEvent::Finished { reason: FinishReason::Cancelled, .. } => {
                debug!(request_id, voice = %name, "voice not warmed: the engine keeps no voice state");
                return false;
            }
            JobEvent::Finished { prompt_rows, .. } => {
                let ms = started.elapsed().as_secs_f64() * 1e3;
                info!(request_id, voice = %name, prefix_rows = prompt_rows, ms, "voice warmed");
                return true;
            }
            JobEvent::Failed { message } | JobEvent::Refused { message } => {
                warn!(request_id, voice = %name, error = %message, "warming the voice failed; its first request runs its prefix");
                return false;
            }
            JobEvent::Started { .. } | JobEvent::Audio(_) => {}
        }
    }
    false
}
