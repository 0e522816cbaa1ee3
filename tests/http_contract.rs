//! The HTTP contract (`shared/spec/api.md`) in process: `router(state).oneshot(request)` against a
//! real `Scheduler` on a tiny random checkpoint. Every row of the error table, content types,
//! the finish reason as header / trailer / final SSE event, SSE usage, same seed ⇒ same bytes,
//! a broken stream on failure, and cancellation when the client goes away.

mod common;
#[path = "http_contract/fixtures.rs"]
mod fixtures;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use base64::Engine as _;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use fixtures::*;

// ---------------------------------------------------------------- the error table

#[tokio::test]
async fn bad_bodies_are_400_in_openai_shape_naming_the_field() {
    let app = shared().await;
    let (status, e) = refused(&app, speech(body(json!({"bogus": 1})))).await;
    assert_eq!(
        (status, e["param"].as_str(), e["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bogus"), Some("unknown_parameter"))
    );
    assert_eq!(e["type"], "invalid_request_error");
    assert!(e["message"].as_str().unwrap().contains("`bogus`"), "{e}");

    let malformed = Request::post("/v1/audio/speech").body(Body::from("{\"model\": ")).unwrap();
    let (status, e) = refused(&app, malformed).await;
    assert_eq!(
        (status, e["code"].as_str(), e["param"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_json"), None)
    );

    // Issue 16, finding 10: a compressed body was read as if it were plain.
    let gzip = Request::post("/v1/audio/speech")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_ENCODING, "gzip")
        .body(Body::from(body(json!({})).to_string()))
        .unwrap();
    let (status, e) = refused(&app, gzip).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, Some("unsupported_content_encoding"))
    );
    let identity = Request::post("/v1/audio/speech")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_ENCODING, "identity")
        .body(Body::from(body(json!({"response_format": "pcm", "max_frames": 1})).to_string()))
        .unwrap();
    assert_eq!(send(&app, identity).await.status(), StatusCode::OK);

    let form = Request::post("/v1/audio/speech")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(body(json!({})).to_string()))
        .unwrap();
    assert_eq!(refused(&app, form).await.0, StatusCode::BAD_REQUEST);

    let cases = [
        (json!({"model": MODEL}), "input"),
        (json!({"input": "hi"}), "model"),
        (body(json!({"input": "a <|im_start|> b"})), "input"),
        (body(json!({"input": "<|speaker:16|> hi"})), "input"),
        (body(json!({"voice": "dave"})), "voice"),
        (body(json!({"voice": {"id": "voice_123"}})), "voice"),
        (body(json!({"speed": 4.01})), "speed"),
        (body(json!({"speed": "fast"})), "speed"),
        (body(json!({"temperature": -0.5})), "temperature"),
        (body(json!({"top_p": 1.5})), "top_p"),
        (body(json!({"sample_rate": 96000})), "sample_rate"),
        (body(json!({"max_frames": MAX_FRAMES + 1})), "max_frames"),
        (body(json!({"response_format": "ogg"})), "response_format"),
        (body(json!({"stream_format": "sse", "stream": false})), "stream"),
        (body(json!({"input": "x".repeat(201)})), "input"),
    ];
    for (request, param) in cases {
        let (status, e) = refused(&app, speech(request.clone())).await;
        assert_eq!((status, e["param"].as_str()), (StatusCode::BAD_REQUEST, Some(param)), "{request}: {e}");
        assert_eq!(e["type"], "invalid_request_error");
    }
    let (_, e) = refused(&app, speech(body(json!({"voice": "dave"})))).await;
    assert!(e["message"].as_str().unwrap().contains("`dave`"), "{e}");
}

/// Issue 16, finding 4: the tokenizer's special tokens other than speaker tags became one control
/// token each in the prompt. Each is now a 400 naming `input` and the token, anywhere in a text
/// (in a long text's later chunk too, whose prompt is built only as the stream runs), while
/// well-formed speaker tags still pass.
#[tokio::test]
async fn control_tokens_in_input_are_400_naming_them() {
    let app = app_with_input_limit(shared_scheduler().await, 2000);
    let tokens = [
        "<|endoftext|>",
        "<|audio_start|>",
        "<|audio_end|>",
        "<|pad|>",
        "<|audio_pad|>",
        "<|phoneme_start|>",
        "<|phoneme_end|>",
    ];
    let long_tail = format!("{} And at the very end {{}} is hidden.", "A plain sentence. ".repeat(30));
    for token in tokens {
        for input in [format!("a {token} b"), long_tail.replace("{}", token)] {
            let (status, e) = refused(&app, speech(body(json!({"input": input, "max_frames": 1})))).await;
            assert_eq!((status, e["param"].as_str()), (StatusCode::BAD_REQUEST, Some("input")), "{token}: {e}");
            assert!(e["message"].as_str().unwrap().contains(token), "{token}: {e}");
        }
    }
    let tagged = speech(body(
        json!({"input": "<|speaker:1|> hi <|speaker:0|> there", "response_format": "pcm", "max_frames": 1}),
    ));
    assert_eq!(send(&app, tagged).await.status(), StatusCode::OK, "speaker tags are text's own");
}

/// Issue 16, finding 6: a client that leaves mid-stream was logged and counted as `status 200`
/// with no finish reason; it is `cancelled`.
#[tokio::test]
async fn a_client_that_leaves_mid_stream_is_counted_cancelled() {
    let app = shared().await;
    let resp = send(&app, speech(body(json!({"response_format": "pcm", "max_frames": MAX_FRAMES})))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a first chunk").expect("audio");
    assert!(first.data_ref().is_some_and(|d| !d.is_empty()));
    drop(body);
    let series = "limelight_requests_total{status=\"200\",format=\"pcm\",finish_reason=\"cancelled\"}";
    let mut text = String::new();
    for _ in 0..200 {
        text = String::from_utf8(bytes_of(send(&app, get("/metrics")).await).await).unwrap();
        if text.contains(series) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no {series} in {text}");
}

#[tokio::test]
async fn unknown_model_is_404_model_not_found() {
    let app = shared().await;
    let (status, e) = refused(&app, speech(body(json!({"model": "gpt-5-tts"})))).await;
    assert_eq!(
        (status, e["code"].as_str(), e["param"].as_str()),
        (StatusCode::NOT_FOUND, Some("model_not_found"), Some("model"))
    );
    assert!(e["message"].as_str().unwrap().contains("`gpt-5-tts`"), "{e}");
    // Issue 16, finding 7: a huge name is quoted cut, not echoed whole.
    let huge = "m".repeat(1_500);
    let (status, e) = refused(&app, speech(body(json!({"model": huge})))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let message = e["message"].as_str().unwrap();
    assert!(message.len() < 300 && message.contains(&format!("`{}…`", "m".repeat(64))), "{message}");
    // Every alias is served.
    for alias in ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"] {
        let resp = send(&app, speech(body(json!({"model": alias, "response_format": "pcm", "max_frames": 1})))).await;
        assert_eq!(resp.status(), StatusCode::OK, "{alias}");
    }
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let app = shared().await;
    let big = body(json!({"instructions": "y".repeat(MAX_BODY)})).to_string();
    let declared = Request::post("/v1/audio/speech")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, big.len())
        .body(Body::from(big.clone()))
        .unwrap();
    let (status, e) = refused(&app, declared).await;
    assert_eq!((status, e["code"].as_str()), (StatusCode::PAYLOAD_TOO_LARGE, Some("request_too_large")));
    // Without a declared length (chunked upload) the limit holds while reading.
    let chunks = big.into_bytes().chunks(256).map(|c| Ok::<_, std::io::Error>(c.to_vec())).collect::<Vec<_>>();
    let streamed = Request::post("/v1/audio/speech")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(futures_util::stream::iter(chunks)))
        .unwrap();
    assert_eq!(refused(&app, streamed).await.0, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn api_key_guards_all_but_health_and_ready() {
    let app = app(shared_scheduler().await, Some(KEY));
    let (status, e) = refused(&app, speech(body(json!({})))).await;
    assert_eq!((status, e["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("invalid_api_key")));
    let mut wrong = get("/v1/models");
    wrong.headers_mut().insert(header::AUTHORIZATION, "Bearer sk-test-kez".parse().unwrap());
    assert_eq!(refused(&app, wrong).await.0, StatusCode::UNAUTHORIZED);
    let mut right = get("/v1/models");
    right.headers_mut().insert(header::AUTHORIZATION, format!("Bearer {KEY}").parse().unwrap());
    assert_eq!(send(&app, right).await.status(), StatusCode::OK);
    assert_eq!(send(&app, get("/health")).await.status(), StatusCode::OK);
    assert_eq!(send(&app, get("/ready")).await.status(), StatusCode::OK);
    assert_eq!(refused(&app, get("/metrics")).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn any_of_several_api_keys_is_accepted() {
    let app = app_with_keys(shared_scheduler().await, vec!["sk-old", "sk-new"]);
    for key in ["sk-old", "sk-new"] {
        let mut req = get("/v1/models");
        req.headers_mut().insert(header::AUTHORIZATION, format!("Bearer {key}").parse().unwrap());
        assert_eq!(send(&app, req).await.status(), StatusCode::OK, "{key}");
    }
    let mut req = get("/v1/models");
    req.headers_mut().insert(header::AUTHORIZATION, "Bearer sk-older".parse().unwrap());
    assert_eq!(refused(&app, req).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn full_queue_is_429_with_retry_after() {
    let control = Control::default();
    let scheduler = wrapped(Mode::Gated, 1, control.clone(), None);
    scheduler.loaded().await.unwrap();
    let app = app(scheduler.clone(), None);
    let pcm = || speech(body(json!({"response_format": "pcm", "max_frames": 1})));
    // A runs (held by `control`), B waits in the one queue slot, C is refused.
    let a = tokio::spawn(send_owned(app.clone(), pcm()));
    wait_until(|| scheduler.active() == 1).await;
    let b = tokio::spawn(send_owned(app.clone(), pcm()));
    wait_until(|| scheduler.queue_depth() == 1).await;
    let resp = send(&app, pcm()).await;
    let retry_after = resp.headers().get(header::RETRY_AFTER).expect("Retry-After").to_str().unwrap().to_owned();
    assert!(retry_after.parse::<u64>().unwrap() >= 1, "{retry_after}");
    let (status, e) = error_of(resp).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{e}");
    control.open();
    for held in [a, b] {
        assert_eq!(held.await.unwrap().status(), StatusCode::OK);
    }
}

#[tokio::test]
async fn loading_is_503_with_retry_after_then_ready() {
    let load_gate = Control::default();
    let scheduler = wrapped(Mode::Gated, 1, Control::default(), Some(load_gate.clone()));
    let app = app(scheduler.clone(), None);
    let resp = send(&app, speech(body(json!({})))).await;
    assert!(resp.headers().contains_key(header::RETRY_AFTER));
    let (status, e) = error_of(resp).await;
    assert_eq!((status, e["code"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("model_loading")));
    let ready = send(&app, get("/ready")).await;
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(ready.headers().contains_key(header::RETRY_AFTER));
    assert_eq!(send(&app, get("/health")).await.status(), StatusCode::OK, "alive while loading");
    load_gate.open();
    scheduler.loaded().await.unwrap();
    assert_eq!(send(&app, get("/ready")).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn draining_is_503_with_retry_after() {
    // A scheduler of its own: draining the shared one would refuse the other tests.
    let own = plain_scheduler(worker_config(1));
    own.loaded().await.unwrap();
    own.begin_drain();
    let app = app(own, None);
    let resp = send(&app, speech(body(json!({})))).await;
    assert!(resp.headers().contains_key(header::RETRY_AFTER));
    assert_eq!(error_of(resp).await.0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(send(&app, get("/ready")).await.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn internal_failure_is_500_naming_the_request_id() {
    let scheduler = wrapped(Mode::FailAtOnce, 2, Control::default(), None);
    scheduler.loaded().await.unwrap();
    let app = app(scheduler, None);
    for extra in [json!({}), json!({"stream": false}), json!({"stream_format": "sse"})] {
        let mut req = speech(body(extra));
        req.headers_mut().insert("x-request-id", "client-id-42".parse().unwrap());
        let (status, e) = refused(&app, req).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(e["message"].as_str().unwrap().contains("client-id-42"), "{e}");
    }
}

/// Issue 16, injected fault: a request whose stream finds no device memory when it joins the
/// batch is refused with 503 `insufficient_memory` and `Retry-After`, in every delivery; a
/// request running beside it, and the next one, are served as usual.
#[tokio::test]
async fn no_device_memory_at_admission_is_503_for_that_request_alone() {
    let scheduler = wrapped(Mode::OutOfMemoryOnSeed, 4, Control::default(), None);
    scheduler.loaded().await.unwrap();
    let app = app(scheduler, None);
    let healthy = tokio::spawn(send_owned(app.clone(), speech(body(json!({"max_frames": 6, "seed": 3})))));
    for extra in [json!({}), json!({"stream": false}), json!({"stream_format": "sse"})] {
        let mut fields = body(extra);
        fields["seed"] = json!(OOM_SEED);
        let resp = send(&app, speech(fields)).await;
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
        let (status, e) = error_of(resp).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{e}");
        assert_eq!(
            (e["type"].as_str(), e["code"].as_str()),
            (Some("server_error"), Some("insufficient_memory")),
            "{e}"
        );
    }
    let beside = healthy.await.unwrap();
    assert_eq!(beside.status(), StatusCode::OK);
    assert!(!bytes_of(beside).await.is_empty(), "the stream beside it got its audio");
    let after = send(&app, speech(body(json!({"stream": false})))).await;
    assert_eq!(after.status(), StatusCode::OK, "the engine serves on");
}

// ---------------------------------------------------------------- successful replies

const FORMATS: [(&str, &str); 5] =
    [("mp3", "audio/mpeg"), ("opus", "audio/ogg"), ("flac", "audio/flac"), ("wav", "audio/wav"), ("pcm", "audio/pcm")];

#[tokio::test]
async fn whole_replies_carry_length_type_and_finish_reason_header() {
    let app = shared().await;
    for (format, content_type) in FORMATS {
        let resp = send(&app, speech(body(json!({"response_format": format, "stream": false})))).await;
        assert_eq!(resp.status(), StatusCode::OK, "{format}");
        let headers = resp.headers().clone();
        assert_eq!(headers[header::CONTENT_TYPE], content_type);
        assert!(!headers.contains_key(header::TRAILER), "{format}");
        finish_reason(headers.get("x-finish-reason"));
        let audio = bytes_of(resp).await;
        assert!(!audio.is_empty(), "{format}");
        assert_eq!(headers[header::CONTENT_LENGTH], audio.len().to_string().as_str(), "{format}");
    }
    let wav = bytes_of(send(&app, speech(body(json!({"response_format": "wav", "stream": false})))).await).await;
    assert_eq!(&wav[4..8], &((wav.len() - 8) as u32).to_le_bytes(), "a whole wav has exact sizes");
    #[cfg(not(feature = "aac"))]
    {
        let (status, e) = refused(&app, speech(body(json!({"response_format": "aac"})))).await;
        assert_eq!((status, e["param"].as_str()), (StatusCode::BAD_REQUEST, Some("response_format")));
    }
}

#[tokio::test]
async fn streamed_replies_send_the_finish_reason_as_a_trailer() {
    let app = shared().await;
    for (format, content_type) in FORMATS {
        let mut req = speech(body(json!({"response_format": format, "instructions": "calmly"})));
        req.headers_mut().insert(header::TE, "trailers".parse().unwrap());
        let resp = send(&app, req).await;
        assert_eq!(resp.status(), StatusCode::OK, "{format}");
        assert_eq!(resp.headers()[header::CONTENT_TYPE], content_type);
        assert_eq!(resp.headers()[header::TRAILER].to_str().unwrap().to_ascii_lowercase(), "x-finish-reason");
        assert!(!resp.headers().contains_key(header::CONTENT_LENGTH), "{format}: streamed bodies are chunked");
        assert!(!resp.headers().contains_key("x-finish-reason"), "{format}: a trailer, not a header");
        let collected = resp.into_body().collect().await.unwrap();
        finish_reason(collected.trailers().and_then(|t| t.get("x-finish-reason")));
        let audio = collected.to_bytes();
        if format == "wav" {
            assert_eq!(&audio[4..8], &[0xFF; 4], "a streamed wav has the unknown-length RIFF size");
        }
        assert!(!audio.is_empty());
    }
}

#[tokio::test]
async fn same_seed_gives_same_bytes_streamed_or_whole() {
    let app = shared().await;
    let audio = |extra: Value| {
        let app = app.clone();
        async move {
            let resp = send(&app, speech(body(extra))).await;
            assert_eq!(resp.status(), StatusCode::OK);
            let streamed = !resp.headers().contains_key("x-finish-reason");
            let collected = resp.into_body().collect().await.unwrap();
            let reason = collected.trailers().map(|t| t["x-finish-reason"].clone());
            assert_eq!(streamed, reason.is_some());
            collected.to_bytes().to_vec()
        }
    };
    for format in ["pcm", "wav"] {
        let first = audio(json!({"response_format": format, "stream": false})).await;
        let again = audio(json!({"response_format": format, "stream": false})).await;
        assert_eq!(first, again, "{format} whole");
        let streamed = audio(json!({"response_format": format})).await;
        assert_eq!(streamed, audio(json!({"response_format": format})).await, "{format} streamed");
        if format == "pcm" {
            assert_eq!(streamed, first, "pcm does not depend on chunking");
        } else {
            assert_eq!(streamed[44..], first[44..], "wav differs only in its header sizes");
        }
    }
    let other = audio(json!({"response_format": "pcm", "seed": 12})).await;
    assert_ne!(other, audio(json!({"response_format": "pcm"})).await, "another seed, other audio");
}

#[tokio::test]
async fn sse_sends_deltas_then_done_with_usage_and_finish_reason() {
    let app = shared().await;
    let resp = send(&app, speech(body(json!({"response_format": "pcm", "stream_format": "sse"})))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
    assert_eq!(resp.headers()["x-accel-buffering"], "no");
    // Issue 16, finding 10: the deltas' rate, as the other deliveries declare it (pcm: 24 kHz).
    assert_eq!(resp.headers()["x-sample-rate"], "24000");
    let events = sse_events(std::str::from_utf8(&bytes_of(resp).await).unwrap());
    let (done, deltas) = events.split_last().expect("events");
    assert!(!deltas.is_empty());
    let mut audio = Vec::new();
    for delta in deltas {
        assert_eq!(delta["type"], "speech.audio.delta", "{delta}");
        audio.extend(base64::engine::general_purpose::STANDARD.decode(delta["audio"].as_str().unwrap()).unwrap());
    }
    assert_eq!(done["type"], "speech.audio.done", "{done}");
    let usage = &done["usage"];
    let (input, output) = (usage["input_tokens"].as_u64().unwrap(), usage["output_tokens"].as_u64().unwrap());
    assert!(input > 0 && (1..=3).contains(&output), "{usage}");
    assert_eq!(usage["total_tokens"].as_u64(), Some(input + output));
    let reason = done["finish_reason"].as_str().unwrap();
    assert!(reason == "stop" || reason == "length", "{done}");
    // The deltas are the same bytes as the audio body, and carry every frame.
    let whole = bytes_of(send(&app, speech(body(json!({"response_format": "pcm", "stream": false})))).await).await;
    assert_eq!(audio, whole);
    assert_eq!(reason == "length", output == 3);
}

#[tokio::test]
async fn failure_after_the_first_audio_breaks_the_stream() {
    let scheduler = wrapped(Mode::FailAfterFirstAudio, 2, Control::default(), None);
    scheduler.loaded().await.unwrap();
    let app = app(scheduler, None);

    let resp = send(&app, speech(body(json!({"response_format": "pcm"})))).await;
    assert_eq!(resp.status(), StatusCode::OK, "the first audio went out with a 200");
    let mut stream = resp.into_body();
    let first = stream.frame().await.expect("a frame").expect("audio, not an error");
    assert!(first.is_data());
    let mut ended_in_error = false;
    while let Some(frame) = stream.frame().await {
        match frame {
            Ok(frame) => assert!(frame.is_data(), "no trailer after a failure"),
            Err(_) => {
                ended_in_error = true;
                break;
            }
        }
    }
    assert!(ended_in_error, "the stream must end without its terminator");

    let mut req = speech(body(json!({"response_format": "pcm", "stream_format": "sse"})));
    req.headers_mut().insert("x-request-id", "sse-fail-1".parse().unwrap());
    let resp = send(&app, req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let events = sse_events(std::str::from_utf8(&bytes_of(resp).await).unwrap());
    let (last, deltas) = events.split_last().unwrap();
    assert!(!deltas.is_empty() && deltas.iter().all(|d| d["type"] == "speech.audio.delta"));
    assert_eq!(last["type"], "error", "{last}");
    assert!(last["error"]["message"].as_str().unwrap().contains("sse-fail-1"), "{last}");

    let (status, _) = refused(&app, speech(body(json!({"stream": false})))).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
}

/// Issue 16, finding 3: a client that leaves while its prompt runs costs nothing more. The
/// worker checks each job between prompt chunks and before each step, so the job ends once the
/// chunk in flight is done, without a frame. (A long text's prompt is cut per text chunk, so no
/// single chunk's prompt runs long.)
#[tokio::test]
async fn a_client_gone_while_its_prompt_runs_is_stopped_before_any_frame() {
    let control = Control::default();
    let scheduler = wrapped(Mode::Gated, 1, control.clone(), None);
    scheduler.loaded().await.unwrap();
    let app = app(scheduler.clone(), None);
    let request = tokio::spawn(send_owned(app.clone(), speech(body(json!({"response_format": "pcm"})))));
    wait_until(|| scheduler.active() == 1).await;
    // The worker holds inside the prompt's prefill (the latch); the client goes away meanwhile.
    request.abort();
    assert!(request.await.unwrap_err().is_cancelled());
    control.open();
    wait_until(|| scheduler.active() == 0).await;
    assert!(control.saw_cancel(), "the job was stopped, not run to its end");
    assert_eq!(control.steps(), 0, "no frame was generated for it");
}

#[tokio::test]
async fn dropping_the_response_cancels_the_job() {
    let control = Control::default();
    let scheduler = wrapped(Mode::Endless, 1, control.clone(), None);
    scheduler.loaded().await.unwrap();
    let app = app(scheduler.clone(), None);
    let resp = send(&app, speech(body(json!({"response_format": "pcm"})))).await;
    let mut stream = resp.into_body();
    assert!(stream.frame().await.unwrap().unwrap().is_data());
    assert_eq!(scheduler.active(), 1, "still generating");
    assert!(!control.saw_cancel());
    drop(stream);
    // The job can only end by cancellation, and it does, promptly.
    wait_until(|| scheduler.active() == 0).await;
    assert!(control.saw_cancel(), "the engine saw the cancellation");
}

#[tokio::test]
async fn request_ids_are_echoed_when_sane_and_made_otherwise() {
    let app = shared().await;
    let mut req = get("/health");
    req.headers_mut().insert("x-request-id", "abc-123".parse().unwrap());
    assert_eq!(send(&app, req).await.headers()["x-request-id"], "abc-123");
    let mut req = get("/health");
    req.headers_mut().insert("x-request-id", "has space".parse().unwrap());
    let made = send(&app, req).await.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert!(made.starts_with("req_"), "{made}");
    let other = send(&app, get("/health")).await.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_ne!(made, other);
    let resp = send(&app, speech(body(json!({"response_format": "pcm"})))).await;
    assert!(resp.headers()["x-request-id"].to_str().unwrap().starts_with("req_"));
}

#[tokio::test]
async fn ops_routes() {
    let app = shared().await;
    let models: Value = serde_json::from_slice(&bytes_of(send(&app, get("/v1/models")).await).await).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["object"], "model");
    assert!(models["data"][0]["created"].as_u64().unwrap() > 0);
    assert!(models["data"].as_array().unwrap().iter().any(|m| m["id"] == "tts-1"));
    assert_eq!(send(&app, get("/health")).await.status(), StatusCode::OK);
    assert_eq!(send(&app, get("/ready")).await.status(), StatusCode::OK);

    let _ = bytes_of(send(&app, speech(body(json!({"response_format": "pcm", "stream": false})))).await).await;
    let metrics = send(&app, get("/metrics")).await;
    assert!(metrics.headers()[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/plain"));
    let text = String::from_utf8(bytes_of(metrics).await).unwrap();
    assert!(
        text.contains("limelight_requests_total{status=\"200\",format=\"pcm\",finish_reason=\"length\"}"),
        "{text}"
    );
    // The worker split that request's wait for its first audio into its phases.
    for phase in ["queue", "open", "prefill", "first_frame", "codec"] {
        let series = format!("limelight_first_audio_phase_seconds_count{{phase=\"{phase}\"}}");
        assert!(text.contains(&series), "{series} in {text}");
    }
    // The CPU engine captures no step: it publishes no step graph counters.
    assert!(!text.contains("limelight_step_graph_replays_total"), "{text}");

    let (status, e) = refused(&app, get("/v1/nothing")).await;
    assert_eq!((status, e["code"].as_str()), (StatusCode::NOT_FOUND, Some("unknown_url")));
    let (status, _) = refused(&app, get("/v1/audio/speech")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}
