//! Stored voices warmed when a server starts (`http::voice_warm::warm_stored`), in process on
//! the CPU engine (tiny checkpoint): a store that already holds voices (as after a restart) has
//! them kept before any request, and a request in one starts from it. Its own test binary: it
//! reads the process's voice cache counters, which only its one server moves.

mod common;
#[allow(dead_code)]
#[path = "http_contract/fixtures.rs"]
mod fixtures;
#[path = "http_contract/voice_fixtures.rs"]
mod voice_fixtures;

use axum::http::StatusCode;
use serde_json::json;

use fixtures::*;
use limelight::http::router;
use limelight::http::voice_warm::warm_stored;
use limelight::model::load::Checkpoint;
use limelight::model::vocabulary::Vocabulary;
use limelight::voice::store::Voice;
use voice_fixtures::*;

/// A stored voice of `frames` frames of made-up codes, created at `created_at`.
fn voice(name: &str, frames: usize, created_at: u64, vocabulary: &Vocabulary) -> Voice {
    let books = vocabulary.codebooks;
    Voice {
        name: name.into(),
        created_at,
        consent: "yes".into(),
        file_size: 0,
        mime_type: "audio/wav".into(),
        ref_text: format!("The voice called {name}."),
        speaker_description: None,
        codebooks: books,
        codes: (0..frames * books).map(|i| (i * 7 % vocabulary.codebook_size) as u32).collect(),
        audio_seconds: frames as f64 * 2048.0 / 44_100.0,
        audio_stored: false,
    }
}

#[tokio::test]
async fn stored_voices_are_warm_once_the_server_starts() {
    let vocabulary = Vocabulary::of(&Checkpoint::open(checkpoint()).unwrap());
    let store = memory_store();
    for (i, name) in ["oldest", "older", "newest"].iter().enumerate() {
        store.insert(voice(name, 12 + i, 100 + i as u64, &vocabulary), None).unwrap();
    }
    let scheduler = plain_scheduler(worker_config(8));
    scheduler.loaded().await.expect("the tiny model loads");
    let state = state_on(scheduler, store, &[]);
    // At most two: the two newest.
    assert_eq!(warm_stored(&state, 2).await, 2);
    let app = router(state.clone());
    assert_eq!(counter(&app, "limelight_voice_cache_entries").await, 2.0);
    assert_eq!(counter(&app, "limelight_voice_cache_misses_total").await, 2.0);

    let speak = |voice: &str| speech(body(json!({"voice": voice, "response_format": "pcm", "stream": false})));
    let resp = send(&app, speak("newest")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(!bytes_of(resp).await.is_empty());
    assert_eq!(counter(&app, "limelight_voice_cache_hits_total").await, 1.0, "the newest was warm");
    let _ = bytes_of(send(&app, speak("oldest")).await).await;
    assert_eq!(counter(&app, "limelight_voice_cache_misses_total").await, 3.0, "the oldest was not warmed");
    // Warming again finds them kept and runs nothing.
    assert_eq!(warm_stored(&state, 3).await, 3);
    assert_eq!(counter(&app, "limelight_voice_cache_misses_total").await, 3.0);
}
