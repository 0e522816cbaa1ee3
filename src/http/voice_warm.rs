//! A new voice warmed on upload: its prompt prefix (the system message holding its reference)
//! runs on the worker once and its state is kept (`engine::prefix`), so that the voice's first
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
use crate::engine::generate::GenerateOptions;
use crate::model::sampling::SamplingParams;
use crate::request::prompt::{PromptBuilder, Reference};
use crate::request::text::{CallerText, Field};
use crate::scheduler::{Job, JobEvent};
use crate::voice::store::Voice;

/// Text for the warming prompt: only its rows after the prefix differ from a real request's,
/// and none of them runs.
const PLACEHOLDER_TEXT: &str = ".";

/// Queues `voice`'s prompt prefix on the worker, its state to be kept; a task follows the job
/// to its end and logs it.
pub fn warm(state: &AppState, request_id: &str, voice: &Voice) {
    let Ok(vocabulary) = state.scheduler().vocabulary() else { return };
    // The references a request in this voice gets (`voices::references`).
    let references = [Reference::from_frames(voice.ref_text.clone(), &voice.codes, voice.codebooks)];
    let prompt = CallerText::check(PLACEHOLDER_TEXT.to_owned(), Field::Input)
        .map_err(|e| e.to_string())
        .and_then(|text| PromptBuilder::new(vocabulary).build_prompt(&text, &references).map_err(|e| e.to_string()));
    let prompt = match prompt {
        Ok(prompt) => prompt,
        Err(e) => {
            warn!(request_id, voice = %voice.name, error = %e, "the voice's prompt could not be built to warm it");
            return;
        }
    };
    let prefix = prompt.voice_prefix(true);
    // The prefix and the row after it: the kept state's key holds that row too.
    let rows = prompt.rows.slice(0..prefix.rows + 1);
    let span = tracing::info_span!("voice_warm", request_id = %request_id, voice = %voice.name);
    // No frame is drawn: the options only have to be valid.
    let options = GenerateOptions { params: SamplingParams::default(), seed: 0, max_frames: 1, stall: None };
    let job = Job { request_id: request_id.to_owned(), rows, prefix, options, span, more: None };
    let started = Instant::now();
    let mut stream = match state.scheduler().warm(job) {
        Ok(stream) => stream,
        Err(e) => {
            debug!(request_id, voice = %voice.name, reason = %e, "voice not warmed; its first request runs its prefix");
            return;
        }
    };
    // The stream is held to the job's end: dropping it would cancel the job.
    let (request_id, name) = (request_id.to_owned(), voice.name.clone());
    tokio::spawn(async move {
        while let Some(event) = stream.next().await {
            match event {
                JobEvent::Finished { prompt_rows, .. } => {
                    let ms = started.elapsed().as_secs_f64() * 1e3;
                    info!(request_id, voice = %name, prefix_rows = prompt_rows, ms, "voice warmed");
                    return;
                }
                JobEvent::Failed { message } | JobEvent::Refused { message } => {
                    warn!(request_id, voice = %name, error = %message, "warming the voice failed; its first request runs its prefix");
                    return;
                }
                JobEvent::Started { .. } | JobEvent::Audio(_) => {}
            }
        }
    });
}
