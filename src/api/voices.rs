//! `/v1/audio/voices` on the wire (`docs/api.md`, "Voices"): the JSON upload (the multipart form
//! takes the same fields), a voice's description, the list, and the delete reply. The shapes
//! follow sglang-omni 0.1.9's voice registry, itself modelled on OpenAI's custom-voice upload.

use serde::{Deserialize, Serialize};

/// A voice upload as JSON: the audio as base64 or a `data:` URL.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VoiceUpload {
    pub name: Option<String>,
    pub audio_sample: Option<String>,
    pub consent: Option<String>,
    pub ref_text: Option<String>,
    pub speaker_description: Option<String>,
    /// The audio's media type when `audio_sample` is bare base64 (a `data:` URL carries its own).
    pub media_type: Option<String>,
    /// Extension: also keep the uploaded audio on disk (default: codes and transcript only).
    pub store_audio: Option<bool>,
}

/// One stored voice.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VoiceInfo {
    pub name: String,
    pub consent: String,
    pub created_at: u64,
    pub file_size: usize,
    pub mime_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ref_text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speaker_description: Option<String>,
    /// Extension: the reference's code frames and the seconds of audio they came from.
    pub frames: usize,
    pub audio_seconds: f64,
}

/// `GET /v1/audio/voices`: every name a request may give, and the uploaded voices.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VoiceList {
    pub voices: Vec<String>,
    pub uploaded_voices: Vec<VoiceInfo>,
}

/// `DELETE /v1/audio/voices/{name}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VoiceDeleted {
    pub success: bool,
    pub message: String,
}
