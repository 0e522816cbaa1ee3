//! A voice warmed on upload (`http::voice_warm`), in process on the CPU engine (tiny
//! checkpoint): the upload queues the voice's prompt prefix, whose state is kept, so the voice's
//! first request starts from it; and that request's bytes are those of a server that keeps no
//! prefix and runs it whole. Its own test binary: it reads the process's voice cache counters,
//! which no other test may move meanwhile.

mod common;
#[allow(dead_code)]
#[path = "http_contract/fixtures.rs"]
mod fixtures;
#[path = "http_contract/voice_fixtures.rs"]
mod voice_fixtures;

use axum::Router;
use axum::http::StatusCode;
use serde_json::json;

use fixtures::*;
use limelight::engine::generate::PREFILL_CHUNK;
use limelight::http::router;
use limelight::http::voice_warm::{WARM_AT_START, warm_stored};
use limelight::scheduler::{BatchLimits, Scheduler, cpu_loader};
use voice_fixtures::*;

async fn speak_as_narrator(app: &Router) -> Vec<u8> {
    let req = speech(body(json!({"voice": "narrator", "response_format": "pcm", "stream": false, "seed": 11})));
    let resp = send(app, req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    bytes_of(resp).await
}

#[tokio::test]
async fn an_uploaded_voice_is_warm_for_its_first_request_with_the_same_bytes() {
    let app = app_with(memory_store(), &[]).await;
    let (status, info) = json_of(&app, multipart(NARRATOR, Some(&clip_wav()))).await;
    assert_eq!(status, StatusCode::OK, "{info}");
    // The upload queued its prefix, which runs (a miss) and is kept.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while counter(&app, "limelight_voice_cache_entries").await < 1.0 {
        assert!(std::time::Instant::now() < deadline, "the voice was never warmed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(counter(&app, "limelight_voice_cache_misses_total").await, 1.0);
    assert_eq!(counter(&app, "limelight_voice_cache_entries").await, 1.0);
    assert_eq!(counter(&app, "limelight_voice_cache_hits_total").await, 0.0);

    let warmed = speak_as_narrator(&app).await;
    assert_eq!(counter(&app, "limelight_voice_cache_hits_total").await, 1.0, "the first request started warm");
    assert_eq!(counter(&app, "limelight_voice_cache_misses_total").await, 1.0);

    // A server that keeps no prefix: the upload warms nothing, the request runs its prefix.
    let limits =
        BatchLimits { max_batch: Some(4), prefill_chunk: PREFILL_CHUNK, voice_cache_bytes: 0, codec_thread: true };
    let config = worker_config(8);
    let cold = Scheduler::start_with(config.clone(), cpu_loader(config.model_dir.clone(), MAX_FRAMES, limits));
    cold.loaded().await.expect("the tiny model loads");
    let cold_state = state_on(cold, memory_store(), &[]);
    let cold_app = router(cold_state.clone());
    let (status, info) = json_of(&cold_app, multipart(NARRATOR, Some(&clip_wav()))).await;
    assert_eq!(status, StatusCode::OK, "{info}");
    assert_eq!(warm_stored(&cold_state, WARM_AT_START).await, 0, "it keeps no voice state");
    assert_eq!(speak_as_narrator(&cold_app).await, warmed, "warm or cold, the same bytes");
    assert_eq!(counter(&app, "limelight_voice_cache_hits_total").await, 1.0, "the cold server kept nothing");
}
