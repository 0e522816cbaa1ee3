//! `/v1/audio/voices` (`docs/api.md`, "Voices"): upload a reference clip and its transcript as a
//! named voice, list, describe and delete voices; and how a speech request's `voice` becomes
//! references for its prompt.
//!
//! An upload is checked field by field (name, consent, transcript, then the audio: decoded,
//! mixed down and resampled in a child process, `voice::isolated`), encoded by the worker's
//! codec encoder (one clip per turn, beside the decode batch), then stored; its prompt prefix
//! is then warmed on the worker (`voice_warm`) while the upload is answered.

use axum::Json;
use axum::extract::{FromRequest, Multipart, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use tracing::{error, info};

use super::error::{check_content_encoding, parse_json, read_error};
use super::{ApiError, AppState, RequestId};
use crate::api::voices::{VoiceDeleted, VoiceInfo, VoiceList, VoiceUpload};
use std::collections::BTreeMap;

use crate::request::chunked::ChunkVoices;
use crate::request::prompt::Reference;
use crate::request::text::{Field, validate_caller_text};
use crate::request::validate::{OPENAI_VOICES, ValidateError, VoiceChoice};
use crate::scheduler::EncodeJob;
use crate::voice::clip::{Clip, ClipError, ClipLimits};
use crate::voice::store::{StoreError, Voice, validate_name};

/// Longest transcript and speaker description, in characters.
const MAX_TEXT_CHARS: usize = 2000;
/// Bytes a multipart or JSON upload may carry beyond the audio (the other fields, the framing).
pub const UPLOAD_OVERHEAD_BYTES: usize = 64 << 10;

/// `GET /v1/audio/voices`.
pub async fn list(State(state): State<AppState>) -> Json<VoiceList> {
    let uploaded: Vec<VoiceInfo> = state.voices().list().iter().map(|v| info(v)).collect();
    let mut voices: Vec<String> = std::iter::once("default").chain(OPENAI_VOICES).map(str::to_owned).collect();
    voices.extend(uploaded.iter().map(|v| v.name.clone()));
    Json(VoiceList { voices, uploaded_voices: uploaded })
}

/// `GET /v1/audio/voices/{name}`.
pub async fn describe(State(state): State<AppState>, Path(name): Path<String>) -> Result<Json<VoiceInfo>, ApiError> {
    state.voices().get(&name).map(|v| Json(info(&v))).ok_or_else(|| not_found(&name))
}

/// `DELETE /v1/audio/voices/{name}`.
pub async fn delete(
    State(state): State<AppState>,
    RequestId(request_id): RequestId,
    Path(name): Path<String>,
) -> Result<Json<VoiceDeleted>, ApiError> {
    let store = state.voices_arc();
    let target = name.clone();
    let removed = tokio::task::spawn_blocking(move || store.remove(&target)).await.expect("the store does not panic");
    match removed {
        Ok(()) => {
            info!(voice = %name, "voice deleted");
            Ok(Json(VoiceDeleted { success: true, message: format!("Voice '{name}' deleted successfully") }))
        }
        Err(StoreError::NotFound(_)) => Err(not_found(&name)),
        Err(e) => {
            error!(request_id, voice = %name, error = %e, "deleting a voice failed");
            Err(ApiError::Internal { request_id })
        }
    }
}

/// `POST /v1/audio/voices`: multipart form (as OpenAI and sglang-omni take it) or JSON.
pub async fn upload(State(state): State<AppState>, RequestId(request_id): RequestId, req: Request) -> Response {
    match create(&state, &request_id, req).await {
        Ok(voice) => (StatusCode::OK, Json(voice)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// An upload's fields, from either body.
#[derive(Default)]
struct Upload {
    name: Option<String>,
    audio: Option<Vec<u8>>,
    media_type: Option<String>,
    consent: Option<String>,
    ref_text: Option<String>,
    speaker_description: Option<String>,
    store_audio: bool,
}

async fn create(state: &AppState, request_id: &str, req: Request) -> Result<VoiceInfo, ApiError> {
    can_encode(state)?;
    check_content_encoding(req.headers())?;
    let limits = ClipLimits { max_bytes: state.config().max_voice_upload_bytes, ..ClipLimits::default() };
    let is_multipart = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().starts_with("multipart/form-data"));
    let upload =
        if is_multipart { read_multipart(req, state).await? } else { read_json(req, limits.max_bytes).await? };
    let name = required(upload.name, "name")?;
    validate_name(&name).map_err(|e| field("name", e.to_string()))?;
    if state.voices().get(&name).is_some() {
        return Err(ApiError::VoiceExists { name });
    }
    let consent = required(upload.consent, "consent")?;
    let ref_text = required(upload.ref_text, "ref_text")?;
    validate_caller_text(&ref_text, Field::Reference(0)).map_err(|e| field("ref_text", e.to_string()))?;
    if let Ok(vocabulary) = state.scheduler().vocabulary()
        && let Some(token) = vocabulary.control_tokens.find(&ref_text)
    {
        // It would be a control token in every prompt of the voice.
        return Err(field(
            "ref_text",
            format!("ref_text: {token} is a special token of the tokenizer and must not appear in caller text"),
        ));
    }
    for (param, text) in [("ref_text", Some(&ref_text)), ("speaker_description", upload.speaker_description.as_ref())] {
        if text.is_some_and(|t| t.chars().count() > MAX_TEXT_CHARS) {
            return Err(field(param, format!("`{param}` is longer than {MAX_TEXT_CHARS} characters")));
        }
    }
    if consent.chars().count() > MAX_TEXT_CHARS {
        return Err(field("consent", format!("`consent` is longer than {MAX_TEXT_CHARS} characters")));
    }
    let audio = required_bytes(upload.audio, "audio_sample")?;
    let (bytes, decoded) = decode_clip(state, request_id, audio, upload.media_type.clone(), limits).await?;
    let clip = decoded.map_err(|e| field("audio_sample", format!("`audio_sample`: {e}")))?;
    let audio_seconds = clip.seconds();

    let span = tracing::info_span!("voice_upload", request_id = %request_id, voice = %name);
    let pending = state.scheduler().encode(EncodeJob { samples: clip.samples, span })?;
    let encoded = match pending.await {
        Ok(Ok(encoded)) => encoded,
        Ok(Err(message)) => {
            error!(request_id, voice = %name, error = %message, "encoding a reference failed");
            return Err(ApiError::Internal { request_id: request_id.to_owned() });
        }
        Err(_) => return Err(ApiError::Internal { request_id: request_id.to_owned() }),
    };
    let voice = Voice {
        name: name.clone(),
        created_at: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        consent,
        file_size: bytes.len(),
        mime_type: upload.media_type.unwrap_or_else(|| String::from("application/octet-stream")),
        ref_text,
        speaker_description: upload.speaker_description,
        codebooks: encoded.codebooks,
        codes: encoded.codes,
        audio_seconds,
        audio_stored: upload.store_audio,
    };
    let store = state.voices_arc();
    let keep = upload.store_audio.then_some(bytes);
    let inserted = tokio::task::spawn_blocking(move || store.insert(voice, keep.as_deref()))
        .await
        .expect("the store does not panic");
    match inserted {
        Ok(voice) => {
            info!(request_id, voice = %name, frames = voice.frames(), audio_secs = voice.audio_seconds, "voice created");
            super::voice_warm::warm(state, request_id, &voice);
            Ok(info(&voice))
        }
        Err(StoreError::Exists(name)) => Err(ApiError::VoiceExists { name }),
        Err(StoreError::Full { max }) => Err(ApiError::VoicesFull { max }),
        Err(StoreError::Name(message)) => Err(field("name", message)),
        Err(e) => {
            error!(request_id, voice = %name, error = %e, "storing a voice failed");
            Err(ApiError::Internal { request_id: request_id.to_owned() })
        }
    }
}

async fn read_multipart(req: Request, state: &AppState) -> Result<Upload, ApiError> {
    let limit = state.config().max_voice_upload_bytes;
    let malformed = |e: axum::extract::multipart::MultipartError| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::BodyTooLarge { limit: limit + UPLOAD_OVERHEAD_BYTES }
        } else {
            ApiError::BadBody { message: format!("Malformed multipart body: {e}"), param: None, code: "invalid_body" }
        }
    };
    let mut form = Multipart::from_request(req, state).await.map_err(|e| ApiError::BadBody {
        message: format!("Malformed multipart body: {e}"),
        param: None,
        code: "invalid_body",
    })?;
    let mut upload = Upload::default();
    while let Some(part) = form.next_field().await.map_err(malformed)? {
        let key = part.name().unwrap_or_default().to_owned();
        if key == "audio_sample" {
            upload.media_type = upload.media_type.or_else(|| part.content_type().map(str::to_owned));
            upload.audio = Some(part.bytes().await.map_err(malformed)?.to_vec());
            continue;
        }
        let value = part.text().await.map_err(malformed)?;
        match key.as_str() {
            "name" => upload.name = Some(value),
            "consent" => upload.consent = Some(value),
            "ref_text" => upload.ref_text = Some(value),
            "speaker_description" => upload.speaker_description = Some(value),
            "media_type" => upload.media_type = Some(value),
            "store_audio" => upload.store_audio = flag(&value)?,
            other => return Err(unknown(other)),
        }
    }
    Ok(upload)
}

async fn read_json(req: Request, max_audio: usize) -> Result<Upload, ApiError> {
    // Base64 takes 4 bytes for every 3.
    let limit = max_audio.div_ceil(3) * 4 + UPLOAD_OVERHEAD_BYTES;
    let bytes = axum::body::to_bytes(req.into_body(), limit).await.map_err(|e| read_error(e, limit))?;
    let json: VoiceUpload = parse_json(&bytes)?;
    let (audio, media_type) = match json.audio_sample {
        Some(text) => {
            let (media_type, data) = split_data_url(&text);
            let audio = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| field("audio_sample", format!("`audio_sample` is not base64 or a data URL: {e}")))?;
            (Some(audio), media_type.or(json.media_type))
        }
        None => (None, json.media_type),
    };
    Ok(Upload {
        name: json.name,
        audio,
        media_type,
        consent: json.consent,
        ref_text: json.ref_text,
        speaker_description: json.speaker_description,
        store_audio: json.store_audio.unwrap_or(false),
    })
}

/// `data:audio/wav;base64,AAAA` → (`audio/wav`, `AAAA`); anything else is bare base64.
pub fn split_data_url(text: &str) -> (Option<String>, &str) {
    match text.strip_prefix("data:").and_then(|rest| rest.split_once(',')) {
        Some((meta, data)) => {
            let media_type = meta.split(';').next().filter(|m| !m.is_empty()).map(str::to_owned);
            (media_type, data)
        }
        None => (None, text),
    }
}

/// The references a speech request's voice brings to its prompt (none for the default voice).
pub fn references(state: &AppState, choice: &VoiceChoice) -> Result<Vec<Reference>, ApiError> {
    let name = match choice {
        VoiceChoice::Default => return Ok(Vec::new()),
        VoiceChoice::Builtin(builtin) => match state.config().voice_aliases.get(builtin) {
            Some(stored) => stored.clone(),
            None => return Ok(Vec::new()),
        },
        VoiceChoice::Named(name) => name.clone(),
    };
    let voice = state.voices().get(&name).ok_or(ApiError::Invalid(ValidateError::UnknownVoice { voice: name }))?;
    Ok(vec![Reference::from_frames(voice.ref_text.clone(), &voice.codes, voice.codebooks)])
}

/// Whose references a request's chunks carry: `references` (its `voice`'s, or its inline ones)
/// for the whole text; or, with `voices` (dialogue), each listed speaker's stored voice, and
/// `references` for speaker 0 unless it is listed (an entry takes its place over `voice`).
pub fn speaker_references(
    state: &AppState,
    speaker_voices: &BTreeMap<u32, VoiceChoice>,
    references: Vec<Reference>,
) -> Result<ChunkVoices, ApiError> {
    if speaker_voices.is_empty() {
        return Ok(ChunkVoices::All(references));
    }
    let mut by_speaker = BTreeMap::new();
    if !references.is_empty() {
        by_speaker.insert(0, references);
    }
    for (&speaker, choice) in speaker_voices {
        let refs = self::references(state, choice).map_err(|e| match e {
            ApiError::Invalid(ValidateError::UnknownVoice { voice }) => {
                ApiError::Invalid(ValidateError::UnknownSpeakerVoice { speaker: speaker.to_string(), voice })
            }
            other => other,
        })?;
        by_speaker.insert(speaker, refs);
    }
    Ok(ChunkVoices::BySpeaker(by_speaker))
}

/// A speech request's inline references (extension), each decoded and encoded for this request
/// alone: the clip as base64 or a `data:` URL, with its transcript.
pub async fn encode_inline(
    state: &AppState,
    request_id: &str,
    inline: &[(String, String)],
) -> Result<Vec<Reference>, ApiError> {
    can_encode(state)?;
    let mut out = Vec::with_capacity(inline.len());
    for (i, (audio, text)) in inline.iter().enumerate() {
        let bad = |message: String| ApiError::Invalid(ValidateError::Format { field: "references", message });
        let (media_type, data) = split_data_url(audio);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| bad(format!("`references.{i}.audio` is not base64 or a data URL: {e}")))?;
        let limits = ClipLimits { max_bytes: state.config().max_voice_upload_bytes, ..ClipLimits::default() };
        let (_, decoded) = decode_clip(state, request_id, bytes, media_type, limits).await?;
        let clip = decoded.map_err(|e| bad(format!("`references.{i}.audio`: {e}")))?;
        let span = tracing::info_span!("inline_reference", request_id = %request_id, reference = i);
        let encoded = match state.scheduler().encode(EncodeJob { samples: clip.samples, span })?.await {
            Ok(Ok(encoded)) => encoded,
            Ok(Err(message)) => {
                error!(request_id, reference = i, error = %message, "encoding an inline reference failed");
                return Err(ApiError::Internal { request_id: request_id.to_owned() });
            }
            Err(_) => return Err(ApiError::Internal { request_id: request_id.to_owned() }),
        };
        out.push(Reference::from_frames(text.clone(), &encoded.codes, encoded.codebooks));
    }
    Ok(out)
}

/// Decodes a client's clip in a child process (`voice::isolated`), at most `--clip-decoders` at
/// once: whatever the file does to its decoder, this request alone is refused. Gives the bytes
/// back (an upload may store them). The outer error is a 500: the decoder could not be run.
async fn decode_clip(
    state: &AppState,
    request_id: &str,
    bytes: Vec<u8>,
    media_type: Option<String>,
    limits: ClipLimits,
) -> Result<(Vec<u8>, Result<Clip, ClipError>), ApiError> {
    let _turn = state.clip_decoder_turn().await;
    let decoder = state.config().clip_decoder.clone();
    let ran = tokio::task::spawn_blocking(move || {
        let decoded = decoder.decode(&bytes, media_type.as_deref(), &limits);
        (bytes, decoded)
    })
    .await;
    let internal = || ApiError::Internal { request_id: request_id.to_owned() };
    match ran {
        Ok((bytes, Ok(decoded))) => Ok((bytes, decoded)),
        Ok((_, Err(e))) => {
            error!(request_id, error = %e, "a reference clip could not be decoded: the decoder did not run");
            Err(internal())
        }
        Err(e) => {
            error!(request_id, error = %e, "the clip decoder's thread failed");
            Err(internal())
        }
    }
}

/// Refuses at once when the loaded engine has no codec encoder (503), or is not loaded yet.
fn can_encode(state: &AppState) -> Result<(), ApiError> {
    match state.scheduler().model_info() {
        Some(info) if info.encodes_references => Ok(()),
        Some(_) => Err(ApiError::NoEncoder),
        None => Err(ApiError::Submit(crate::scheduler::SubmitError::Loading)),
    }
}

fn info(v: &Voice) -> VoiceInfo {
    VoiceInfo {
        name: v.name.clone(),
        consent: v.consent.clone(),
        created_at: v.created_at,
        file_size: v.file_size,
        mime_type: v.mime_type.clone(),
        ref_text: Some(v.ref_text.clone()),
        speaker_description: v.speaker_description.clone(),
        frames: v.frames(),
        audio_seconds: v.audio_seconds,
    }
}

fn required(value: Option<String>, param: &'static str) -> Result<String, ApiError> {
    match value {
        Some(v) if !v.trim().is_empty() => Ok(v),
        Some(_) => Err(field(param, format!("`{param}` must not be empty"))),
        None => Err(field(param, format!("`{param}` is required"))),
    }
}

fn required_bytes(value: Option<Vec<u8>>, param: &'static str) -> Result<Vec<u8>, ApiError> {
    match value {
        Some(v) if !v.is_empty() => Ok(v),
        Some(_) => Err(field(param, format!("`{param}` is empty"))),
        None => Err(field(param, format!("`{param}` is required"))),
    }
}

fn flag(value: &str) -> Result<bool, ApiError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" | "" => Ok(false),
        _ => Err(field("store_audio", String::from("`store_audio` must be true or false"))),
    }
}

fn field(param: &'static str, message: String) -> ApiError {
    ApiError::VoiceField { param, message }
}

fn unknown(param: &str) -> ApiError {
    let param: String = param.chars().take(64).collect();
    ApiError::BadBody {
        message: format!("Unknown parameter `{param}`: this server refuses fields it would otherwise ignore"),
        param: Some(param),
        code: "unknown_parameter",
    }
}

fn not_found(name: &str) -> ApiError {
    ApiError::VoiceNotFound { name: name.chars().take(64).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_urls_and_bare_base64() {
        assert_eq!(split_data_url("data:audio/wav;base64,QUJD"), (Some("audio/wav".into()), "QUJD"));
        assert_eq!(split_data_url("data:;base64,QUJD"), (None, "QUJD"));
        assert_eq!(split_data_url("QUJD"), (None, "QUJD"));
    }
}
