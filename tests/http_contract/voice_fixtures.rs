//! Voice uploads in process: a reference clip, the app around a scheduler with a voice store,
//! and upload requests (tests/voices.rs, tests/voice_warm.rs).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::Value;

use super::fixtures::*;
use limelight::audio::{EncodeOptions, ResponseFormat, encoder};
use limelight::http::{AppState, HttpConfig, router};
use limelight::request::validate::SpeechPolicy;
use limelight::voice::store::{StoreLimits, VoiceStore};

/// A 1.2 s two-tone clip as a WAV file at 24 kHz.
pub fn clip_wav() -> Vec<u8> {
    let pcm: Vec<f32> = (0..(1.2 * 44_100.0) as usize)
        .map(|i| {
            let t = i as f32 / 44_100.0;
            0.3 * (std::f32::consts::TAU * 180.0 * t).sin() + 0.2 * (std::f32::consts::TAU * 410.0 * t).sin()
        })
        .collect();
    let mut e = encoder(ResponseFormat::Wav, EncodeOptions { sample_rate: Some(24_000), speed: 1.0, streaming: false })
        .unwrap();
    let mut bytes = e.push(&pcm).unwrap();
    bytes.extend(e.finish().unwrap());
    bytes
}

pub async fn app_with(store: Arc<VoiceStore>, aliases: &[(&str, &str)]) -> Router {
    app_on(shared_scheduler().await, store, aliases)
}

pub fn app_on(scheduler: limelight::scheduler::Scheduler, store: Arc<VoiceStore>, aliases: &[(&str, &str)]) -> Router {
    router(state_on(scheduler, store, aliases))
}

/// The app's state around `scheduler` and `store` (`aliases`: `--voice-alias` pairs).
pub fn state_on(
    scheduler: limelight::scheduler::Scheduler,
    store: Arc<VoiceStore>,
    aliases: &[(&str, &str)],
) -> AppState {
    let config = HttpConfig {
        policy: SpeechPolicy {
            served_model: MODEL.into(),
            aliases: worker_config(0).model_aliases,
            max_input_chars: 200,
            max_frames: MAX_FRAMES,
        },
        api_keys: Vec::new(),
        // Room for inline reference clips in a speech request.
        max_body_bytes: 1 << 20,
        voice_aliases: aliases.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect::<BTreeMap<_, _>>(),
        max_voice_upload_bytes: 1 << 20,
        body_timeout: std::time::Duration::from_secs(30),
        clip_decoder: limelight::voice::isolated::ClipDecoder::new(env!("CARGO_BIN_EXE_limelight"), 2048),
        clip_decoders: 2,
    };
    AppState::with_voices(scheduler, config, store)
}

pub fn memory_store() -> Arc<VoiceStore> {
    Arc::new(VoiceStore::in_memory(StoreLimits::default()))
}

/// A multipart form with the given text fields and, if given, the audio file.
pub fn multipart(fields: &[(&str, &str)], audio: Option<&[u8]>) -> Request<Body> {
    let boundary = "limelight-test-boundary";
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").bytes(),
        );
    }
    if let Some(audio) = audio {
        body.extend(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"audio_sample\"; filename=\"ref.wav\"\r\nContent-Type: audio/wav\r\n\r\n"
            )
            .bytes(),
        );
        body.extend(audio);
        body.extend(b"\r\n");
    }
    body.extend(format!("--{boundary}--\r\n").bytes());
    Request::post("/v1/audio/voices")
        .header(header::CONTENT_TYPE, format!("multipart/form-data; boundary={boundary}"))
        .body(Body::from(body))
        .unwrap()
}

pub fn json_upload(v: Value) -> Request<Body> {
    Request::post("/v1/audio/voices")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(v.to_string()))
        .unwrap()
}

pub fn delete(path: &str) -> Request<Body> {
    Request::delete(path).body(Body::empty()).unwrap()
}

pub async fn json_of(app: &Router, req: Request<Body>) -> (StatusCode, Value) {
    let resp = send(app, req).await;
    let status = resp.status();
    (status, serde_json::from_slice(&bytes_of(resp).await).unwrap())
}

pub const NARRATOR: &[(&str, &str)] =
    &[("name", "narrator"), ("consent", "I recorded this myself"), ("ref_text", "A quiet evening by the river.")];

/// The value of a counter in the app's `/metrics` (0 when not yet published).
pub async fn counter(app: &Router, name: &str) -> f64 {
    let text = String::from_utf8(bytes_of(send(app, get("/metrics")).await).await).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0.0, |v| v.parse().unwrap())
}
