//! `POST /v1/audio/speech` on the wire (`api.md`): the request body with our extensions, and the
//! SSE event payloads. Unknown fields are refused so nothing a client sends is silently ignored.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::error::ErrorDetail;

/// The request body. Every field is optional here so that a missing one is reported by
/// validation, naming the field, rather than by serde.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeechRequest {
    pub model: Option<String>,
    pub input: Option<String>,
    pub voice: Option<Voice>,
    pub instructions: Option<String>,
    pub response_format: Option<ResponseFormat>,
    pub speed: Option<f64>,
    pub stream_format: Option<StreamFormat>,
    // Extensions (api.md "extensions").
    pub seed: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u32>,
    pub max_frames: Option<u64>,
    pub sample_rate: Option<u32>,
    pub stream: Option<bool>,
    /// Speak in the voice of these clips (base64 or `data:` URLs) and their transcripts, encoded
    /// for this request only (`/v1/audio/voices` stores one instead).
    pub references: Option<Vec<InlineReference>>,
    /// Dialogue: a stored voice per speaker id (`"0"`..`"15"`) of the `<|speaker:N|>` turns in
    /// `input`, each a name or `{"id": …}`.
    pub voices: Option<std::collections::BTreeMap<String, Voice>>,
    /// Write numbers, dates, times, currencies and units out as English words before speaking
    /// (default true; `request::normalize`).
    pub normalize: Option<bool>,
}

/// One inline reference (extension): a clip and its transcript.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InlineReference {
    pub audio: Option<String>,
    pub text: Option<String>,
}

/// `voice`: a name, or OpenAI's custom-voice object `{"id": …}` (which allows no other key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Voice {
    Name(String),
    Id(String),
}

impl Voice {
    /// The name or id, whichever form was sent.
    pub fn as_str(&self) -> &str {
        match self {
            Voice::Name(s) | Voice::Id(s) => s,
        }
    }
}

/// `response_format`; the default is `mp3`, as OpenAI's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResponseFormat {
    #[default]
    Mp3,
    Opus,
    Aac,
    Flac,
    Wav,
    Pcm,
}

impl ResponseFormat {
    /// The name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            ResponseFormat::Mp3 => "mp3",
            ResponseFormat::Opus => "opus",
            ResponseFormat::Aac => "aac",
            ResponseFormat::Flac => "flac",
            ResponseFormat::Wav => "wav",
            ResponseFormat::Pcm => "pcm",
        }
    }
}

/// `stream_format`: raw audio bytes (default) or server-sent events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamFormat {
    #[default]
    Audio,
    Sse,
}

/// One SSE `data:` payload. The finish reason rides on `done`, since a stream of events has no
/// trailer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum SpeechEvent {
    /// Base64 of the next bytes of the encoded audio.
    #[serde(rename = "speech.audio.delta")]
    Delta { audio: String },
    #[serde(rename = "speech.audio.done")]
    Done { usage: Usage, finish_reason: String },
    /// A failure after the stream began; the stream ends after it.
    #[serde(rename = "error")]
    Error { error: ErrorDetail },
}

/// Token accounting: prompt rows in, audio frames out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
}

impl Usage {
    pub fn new(input_tokens: u64, output_tokens: u64) -> Usage {
        Usage { input_tokens, output_tokens, total_tokens: input_tokens + output_tokens }
    }
}

impl<'de> Deserialize<'de> for Voice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Voice, D::Error> {
        deserializer.deserialize_any(VoiceVisitor)
    }
}

struct VoiceVisitor;

impl<'de> Visitor<'de> for VoiceVisitor {
    type Value = Voice;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a voice name or an object {"id": "<voice>"}"#)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Voice, E> {
        Ok(Voice::Name(v.to_owned()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Voice, A::Error> {
        let mut id = None;
        while let Some(key) = map.next_key::<String>()? {
            if key != "id" {
                return Err(de::Error::unknown_field(&key, &["id"]));
            }
            if id.is_some() {
                return Err(de::Error::duplicate_field("id"));
            }
            id = Some(map.next_value::<String>()?);
        }
        id.map(Voice::Id).ok_or_else(|| de::Error::missing_field("id"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn voice_takes_both_forms() {
        let r: SpeechRequest = serde_json::from_str(r#"{"voice": "alloy"}"#).unwrap();
        assert_eq!(r.voice, Some(Voice::Name("alloy".into())));
        let r: SpeechRequest = serde_json::from_str(r#"{"voice": {"id": "voice_1"}}"#).unwrap();
        assert_eq!(r.voice, Some(Voice::Id("voice_1".into())));
        let e = serde_json::from_str::<SpeechRequest>(r#"{"voice": {"id": "a", "name": "b"}}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `name`"), "{e}");
        let e = serde_json::from_str::<SpeechRequest>(r#"{"voice": {}}"#).unwrap_err();
        assert!(e.to_string().contains("missing field `id`"), "{e}");
        assert!(serde_json::from_str::<SpeechRequest>(r#"{"voice": 3}"#).is_err());
    }

    #[test]
    fn unknown_fields_and_formats_are_refused() {
        let e = serde_json::from_str::<SpeechRequest>(r#"{"model": "m", "bogus": 1}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `bogus`"), "{e}");
        let e = serde_json::from_str::<SpeechRequest>(r#"{"response_format": "ogg"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown variant `ogg`"), "{e}");
        let r: SpeechRequest = serde_json::from_str(r#"{"response_format": "pcm", "stream_format": "sse"}"#).unwrap();
        assert_eq!((r.response_format, r.stream_format), (Some(ResponseFormat::Pcm), Some(StreamFormat::Sse)));
    }

    #[test]
    fn events_have_openai_shape() {
        let delta = SpeechEvent::Delta { audio: "AAA=".into() };
        assert_eq!(serde_json::to_string(&delta).unwrap(), r#"{"type":"speech.audio.delta","audio":"AAA="}"#);
        let done = SpeechEvent::Done { usage: Usage::new(3, 4), finish_reason: "stop".into() };
        assert_eq!(
            serde_json::to_string(&done).unwrap(),
            r#"{"type":"speech.audio.done","usage":{"input_tokens":3,"output_tokens":4,"total_tokens":7},"finish_reason":"stop"}"#
        );
    }
}
