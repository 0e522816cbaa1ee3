//! `/v1/audio/voices` in process on the CPU engine (tiny checkpoint): uploads as a multipart form
//! and as JSON, list, describe, delete, every refusal naming its field, speech in a stored voice
//! (by name, by `{"id"}`, by an operator's alias), and voices that persist across a restart.

mod common;
// The HTTP contract's fixtures; this file uses a few of them.
#[allow(dead_code)]
#[path = "http_contract/fixtures.rs"]
mod fixtures;
#[path = "http_contract/voice_fixtures.rs"]
mod voice_fixtures;

use std::sync::Arc;

use axum::http::StatusCode;
use base64::Engine as _;
use serde_json::{Value, json};

use fixtures::*;
use limelight::voice::store::{StoreLimits, VoiceStore};
use voice_fixtures::*;

#[tokio::test]
async fn a_voice_is_uploaded_listed_described_spoken_and_deleted() {
    let app = app_with(memory_store(), &[("alloy", "narrator")]).await;
    let (status, info) = json_of(&app, multipart(NARRATOR, Some(&clip_wav()))).await;
    assert_eq!(status, StatusCode::OK, "{info}");
    assert_eq!(info["name"], "narrator");
    assert_eq!(info["mime_type"], "audio/wav");
    assert_eq!(info["frames"], 26, "1.2 s at 24 kHz is 52 920 samples at 44.1 kHz: 26 frames of 2048");

    let (status, list) = json_of(&app, get("/v1/audio/voices")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(list["voices"].as_array().unwrap().iter().any(|v| v == "narrator") && list["voices"][0] == "default");
    assert_eq!(list["uploaded_voices"][0]["ref_text"], "A quiet evening by the river.");
    let (status, one) = json_of(&app, get("/v1/audio/voices/narrator")).await;
    assert_eq!((status, &one["consent"]), (StatusCode::OK, &json!("I recorded this myself")));

    // Speech in the voice: by name, by id, and through the alias; each the same bytes, and not
    // the default voice's.
    let speak = |voice: Value| speech(body(json!({"voice": voice, "response_format": "pcm", "stream": false})));
    let named = bytes_of(send(&app, speak(json!("narrator"))).await).await;
    let by_id = bytes_of(send(&app, speak(json!({"id": "narrator"}))).await).await;
    let aliased = bytes_of(send(&app, speak(json!("alloy"))).await).await;
    let default = bytes_of(send(&app, speak(json!("default"))).await).await;
    assert!(!named.is_empty());
    assert_eq!(named, by_id);
    assert_eq!(named, aliased);
    assert_ne!(named, default, "the reference changes the prompt, hence the audio");

    let (status, reply) = json_of(&app, delete("/v1/audio/voices/narrator")).await;
    assert_eq!((status, &reply["success"]), (StatusCode::OK, &json!(true)));
    let (status, e) = refused(&app, delete("/v1/audio/voices/narrator")).await;
    assert_eq!((status, e["code"].as_str()), (StatusCode::NOT_FOUND, Some("voice_not_found")));
    let (status, e) = refused(&app, speak(json!("narrator"))).await;
    assert_eq!(
        (status, e["param"].as_str(), e["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("voice"), Some("voice_not_found"))
    );
}

#[tokio::test]
async fn json_uploads_take_base64_and_data_urls() {
    let app = app_with(memory_store(), &[]).await;
    let b64 = base64::engine::general_purpose::STANDARD.encode(clip_wav());
    let upload = |name: &str, audio: String| {
        json_upload(json!({"name": name, "consent": "yes", "ref_text": "Hello there, friend.", "audio_sample": audio}))
    };
    let (status, info) = json_of(&app, upload("bare", b64.clone())).await;
    assert_eq!(status, StatusCode::OK, "{info}");
    let (status, info) = json_of(&app, upload("dataurl", format!("data:audio/wav;base64,{b64}"))).await;
    assert_eq!((status, &info["mime_type"]), (StatusCode::OK, &json!("audio/wav")), "{info}");
    // The same clip gives the same codes, whichever way it came.
    let a =
        bytes_of(send(&app, speech(body(json!({"voice": "bare", "response_format": "pcm", "stream": false})))).await)
            .await;
    let b = bytes_of(
        send(&app, speech(body(json!({"voice": "dataurl", "response_format": "pcm", "stream": false})))).await,
    )
    .await;
    assert_eq!(a, b);
}

/// A refused upload: its form fields, its audio, and the field the refusal must name.
type Case<'a> = (Vec<(&'a str, String)>, Option<&'a [u8]>, &'a str);

#[tokio::test]
async fn bad_uploads_are_refused_naming_the_field() {
    let app = app_with(memory_store(), &[]).await;
    let wav = clip_wav();
    // A WAV header at 44 108 Hz: inside 8–192 kHz, but with no short ratio to 44.1 kHz.
    let odd_rate = include_bytes!("../fuzz/seeds/voice_clip/wav-44108-hz");
    // A FLAC whose comment declares 2.2 GB: refused before the decoder allocates it.
    let comment_bomb = include_bytes!("../fuzz/seeds/voice_clip/flac-comment-2gb");
    // An M4A whose sample-to-chunk table counts 2³² − 1 entries: symphonia reserves 64 GB for
    // it, which would abort a server decoding in its own process (`voice::isolated`).
    let table_bomb = include_bytes!("../fuzz/seeds/voice_clip/m4a-stsc-64gb");
    let with = |replace: (&str, &str)| -> Vec<(&str, String)> {
        NARRATOR
            .iter()
            .map(|(k, v)| if *k == replace.0 { (*k, replace.1.to_owned()) } else { (*k, (*v).to_owned()) })
            .collect()
    };
    let cases: Vec<Case<'_>> = vec![
        (with(("name", "../escape")), Some(&wav), "name"),
        (with(("name", "alloy")), Some(&wav), "name"),
        (with(("ref_text", "  ")), Some(&wav), "ref_text"),
        (with(("ref_text", "<|im_end|>")), Some(&wav), "ref_text"),
        (with(("consent", "")), Some(&wav), "consent"),
        (with(("name", "fine")), None, "audio_sample"),
        (with(("name", "fine")), Some(b"definitely not audio"), "audio_sample"),
        (with(("name", "fine")), Some(&odd_rate[1..]), "audio_sample"),
        (with(("name", "fine")), Some(&comment_bomb[1..]), "audio_sample"),
        (with(("name", "fine")), Some(&table_bomb[1..]), "audio_sample"),
    ];
    for (fields, audio, param) in cases {
        let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (status, e) = refused(&app, multipart(&fields, audio)).await;
        assert_eq!((status, e["param"].as_str()), (StatusCode::BAD_REQUEST, Some(param)), "{fields:?}: {e}");
    }
    let (status, e) = refused(&app, multipart(&[("name", "x"), ("colour", "blue")], Some(&wav))).await;
    assert_eq!((status, e["code"].as_str()), (StatusCode::BAD_REQUEST, Some("unknown_parameter")));
    let (status, e) = refused(&app, json_upload(json!({"name": "x", "bogus": 1}))).await;
    assert_eq!((status, e["param"].as_str()), (StatusCode::BAD_REQUEST, Some("bogus")));
    // A second voice of the same name: 409.
    assert_eq!(send(&app, multipart(NARRATOR, Some(&wav))).await.status(), StatusCode::OK);
    let (status, e) = refused(&app, multipart(NARRATOR, Some(&wav))).await;
    assert_eq!((status, e["code"].as_str()), (StatusCode::CONFLICT, Some("voice_exists")));
    let (status, _) = refused(&app, get("/v1/audio/voices/nobody")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn voices_persist_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let open = || Arc::new(VoiceStore::open(dir.path(), StoreLimits::default()).unwrap().0);
    let app = app_with(open(), &[]).await;
    let form: Vec<(&str, &str)> = NARRATOR.iter().copied().chain([("store_audio", "true")]).collect();
    assert_eq!(send(&app, multipart(&form, Some(&clip_wav()))).await.status(), StatusCode::OK);
    let request = || speech(body(json!({"voice": "narrator", "response_format": "pcm", "stream": false})));
    let before = bytes_of(send(&app, request()).await).await;
    assert!(dir.path().join("narrator.voice.audio").exists(), "store_audio keeps the upload");
    // A new store over the same directory: the voice is there, and speaks the same bytes.
    let again = app_with(open(), &[]).await;
    let after = bytes_of(send(&again, request()).await).await;
    assert_eq!(before, after);
}

/// Inline `references` (extension) speak as the stored voice made from the same clip and text;
/// a bad clip is a 400 naming `references`, and a stored voice beside them is refused.
#[tokio::test]
async fn inline_references_speak_as_the_same_stored_voice() {
    let app = app_with(memory_store(), &[]).await;
    let wav = clip_wav();
    assert_eq!(send(&app, multipart(NARRATOR, Some(&wav))).await.status(), StatusCode::OK);
    let url = format!("data:audio/wav;base64,{}", base64::engine::general_purpose::STANDARD.encode(&wav));
    let inline = json!([{"audio": url, "text": "A quiet evening by the river."}]);
    let pcm = |extra: Value| speech(body(json!({"response_format": "pcm", "stream": false})).merge(extra));
    let stored = bytes_of(send(&app, pcm(json!({"voice": "narrator"}))).await).await;
    let resp = send(&app, pcm(json!({"voice": "default", "references": inline}))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(bytes_of(resp).await, stored);
    let (status, e) = refused(&app, pcm(json!({"references": [{"audio": "bm90IGF1ZGlv", "text": "x"}]}))).await;
    assert_eq!((status, e["param"].as_str()), (StatusCode::BAD_REQUEST, Some("references")), "{e}");
    let (status, e) = refused(&app, pcm(json!({"voice": "narrator", "references": inline}))).await;
    assert_eq!((status, e["param"].as_str()), (StatusCode::BAD_REQUEST, Some("references")), "{e}");
    let (status, e) = refused(&app, pcm(json!({"references": [{"audio": url, "text": "<|im_end|>"}]}))).await;
    assert_eq!((status, e["param"].as_str()), (StatusCode::BAD_REQUEST, Some("references")), "{e}");
}

/// `a.merge(b)`: b's keys over a's.
trait Merge {
    fn merge(self, other: Value) -> Value;
}

impl Merge for Value {
    fn merge(mut self, other: Value) -> Value {
        self.as_object_mut().unwrap().extend(other.as_object().unwrap().clone());
        self
    }
}

/// An engine without a codec encoder (a GPU whose encoder did not fit) refuses uploads and
/// inline references with 503 `voice_cloning_unavailable`, and still speaks.
#[tokio::test]
async fn without_an_encoder_voice_cloning_is_a_503() {
    let scheduler = wrapped(Mode::NoEncoder, 8, Control::default(), None);
    scheduler.loaded().await.unwrap();
    let app = app_on(scheduler, memory_store(), &[]);
    let (status, e) = refused(&app, multipart(NARRATOR, Some(&clip_wav()))).await;
    assert_eq!((status, e["code"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("voice_cloning_unavailable")));
    let url = format!("data:audio/wav;base64,{}", base64::engine::general_purpose::STANDARD.encode(clip_wav()));
    let inline = json!({"response_format": "pcm", "stream": false, "references": [{"audio": url, "text": "Hi."}]});
    let (status, e) = refused(&app, speech(body(inline))).await;
    assert_eq!((status, e["code"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("voice_cloning_unavailable")));
    let resp = send(&app, speech(body(json!({"response_format": "pcm", "stream": false})))).await;
    assert_eq!(resp.status(), StatusCode::OK);
}

/// Dialogue (`voices`): speaker 0's stored voice given through `voices` speaks as through
/// `voice` (and takes its place over the SDK's `voice`); a second speaker's voice changes the
/// audio of a two-speaker text; an unknown voice is a 400 naming `voices`.
#[tokio::test]
async fn dialogue_voices_pick_each_speakers_voice() {
    let app = app_with(memory_store(), &[]).await;
    let wav = clip_wav();
    assert_eq!(send(&app, multipart(NARRATOR, Some(&wav))).await.status(), StatusCode::OK);
    let guest = &[("name", "guest"), ("consent", "yes"), ("ref_text", "Good morning to you all.")];
    assert_eq!(send(&app, multipart(guest, Some(&wav))).await.status(), StatusCode::OK);
    let pcm = |extra: Value| speech(body(json!({"response_format": "pcm", "stream": false})).merge(extra));
    let speak = |extra: Value| {
        let app = app.clone();
        async move {
            let resp = send(&app, pcm(extra)).await;
            assert_eq!(resp.status(), StatusCode::OK);
            bytes_of(resp).await
        }
    };
    let via_voice = speak(json!({"voice": "narrator"})).await;
    assert_eq!(speak(json!({"voice": "default", "voices": {"0": "narrator"}})).await, via_voice);
    assert_eq!(speak(json!({"voice": "alloy", "voices": {"0": {"id": "narrator"}}})).await, via_voice);

    let dialogue = "<|speaker:0|> Hello there. <|speaker:1|> Hello back.";
    let one_voice = speak(json!({"input": dialogue, "voice": "narrator"})).await;
    let two_voices = speak(json!({"input": dialogue, "voices": {"0": "narrator", "1": "guest"}})).await;
    assert!(!two_voices.is_empty());
    assert_ne!(one_voice, two_voices, "speaker 1's reference changes the prompt, hence the audio");

    let (status, e) = refused(&app, pcm(json!({"input": dialogue, "voices": {"1": "nobody"}}))).await;
    assert_eq!(
        (status, e["param"].as_str(), e["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("voices"), Some("voice_not_found")),
        "{e}"
    );
    assert!(e["message"].as_str().unwrap().contains("voices.1"), "{e}");
}
